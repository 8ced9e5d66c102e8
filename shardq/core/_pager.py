"""The head budget's reads of the cold backlog, merged with what the reads do not show yet.

`ColdHead` (`_head.py`) decides what stays in memory; `Pager` reads the rest back. A storage's
reads lag the engine's writes (a cold put is stored at the writer's next commit), so the pager
keeps, by row key, every record the engine sent cold and a tombstone for every job paged in
that has left memory since (`sweep`), each stamped with the mark current when it was made.
Every read merges them in: a kept record wins over the stored one, a tombstone hides it.
`committed(mark)` drops what a commit now shows. What it keeps is bounded by the mutations the
writer holds uncommitted (the writer's own batch bound), which is what it mirrors.

A queue-wide removal (Drain, Obliterate: `_cold_wide.py`) leaves one tombstone for the queue,
not one per job (`drop`): until its commit, no stored row of that queue in the states it
names is read (a kept record still is: it is newer than the removal).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

from ._cold import ColdBacklog, ColdPage, Cursor, delayed_cursor, waiting_cursor
from ._job import Job
from ._lifecycle import DELAYED, WAITING
from ._mutations import ROW_KEY_SEP, Mutation, Record, job_id_of
from ._record import slim_record

__all__ = [
    "COLD",
    "HOT_ONLY",
    "MAX_LIMIT",
    "Pager",
    "QueueHead",
    "as_stored",
    "eligible",
    "is_cold",
    "job_of",
    "keep_held",
    "last_puts",
    "park_marked",
    "row_of",
]

COLD: Final = "cold"
"""The record field that marks a job stored cold (1) for the storage."""
MAX_LIMIT: Final = 100_000
"""The most records one page may ask for (the storage's bound)."""
HOT_ONLY: Final = ("groupId", "ttl", "dependsOn", "childrenIds", "parentId", "flowPending")
"""Options that keep a job in memory: its group, TTL or flow needs it there."""


def eligible(job: Job) -> bool:
    """True if `job` may live in the backlog only (see `HOT_ONLY`)."""
    opts = job.opts
    return not opts or not any(opts.get(name) for name in HOT_ONLY)


def row_of(rec: Record) -> str:
    """A record's row key: its id, or for a custom id the id joined to its queue."""
    return str(rec.get("rowKey") or rec["id"])


def job_of(rec: Record) -> Job:
    """The job a cold record stores (the storage's `cold` field is no option of it)."""
    if COLD in rec:
        rec = {k: v for k, v in rec.items() if k != COLD}
    return Job.from_record(rec)


def as_stored(value: Any) -> Any:
    """`value` as a stored record reads back: tuples are lists."""
    if isinstance(value, dict):
        return {k: as_stored(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_stored(v) for v in value]
    return value


def is_cold(rec: Record) -> bool:
    return bool(rec.get(COLD)) and rec.get("state") in (WAITING, DELAYED)


def last_puts(out: Sequence[Mutation]) -> dict[str, Record]:
    """The records `out` puts, by job id, of the jobs no later mutation in `out` changes:
    each is what its job holds now."""
    puts: dict[str, Record] = {}
    for m in out:
        kind = m[0]
        if kind == "put":
            puts[m[1]["id"]] = m[1]
        elif kind in ("upd", "del", "delta") and puts:
            puts.pop(job_id_of(m[1]), None)
    return puts


def park_marked(records: Iterable[Record], marked: list[Record]) -> Iterator[Record]:
    """`records` as they are, noting in `marked` those whose row is marked cold (a restart
    loads such a row when its job left waiting and delayed: `ColdHead.watch_restored`)."""
    for rec in records:
        if rec.get(COLD):
            marked.append({"id": rec["id"], "queue": rec.get("queue"), "rowKey": row_of(rec)})
        yield rec


def _holds(jobs: dict[str, Job], job_id: str, row: str) -> bool:
    job = jobs.get(job_id)
    return job is not None and job.key == row


def keep_held(held: set[str], jobs: Sequence[Job]) -> None:
    """A durable push's job can go cold before its commit is confirmed (`JobStore.hold`):
    paged back in meanwhile, it stays off the ready heap until `confirm` puts it there."""
    if held:
        for job in jobs:
            if job.id in held and job.state == WAITING:
                job.hkey = None


class QueueHead:
    """The cold part of one queue: how many of its jobs are cold, and the cursors."""

    __slots__ = (
        "dcur",
        "delayed",
        "dfloor",
        "paged",
        "parked",
        "parked_floor",
        "prioritized",
        "waiting",
        "wcur",
    )

    def __init__(self) -> None:
        self.waiting = 0
        self.delayed = 0
        self.prioritized = 0  # cold waiting jobs with a priority (GetJobCounts splits them)
        # Every cold job of the queue sorts after these; every job on a heap, at or before.
        self.wcur: Cursor | None = None
        self.dcur: Cursor | None = None
        # Hot delayed jobs the last trim found none to send cold among (`ColdHead._trim`).
        self.dfloor = 0
        # Jobs held in memory whose row still says cold (paged or looked up): if one leaves
        # memory, a stale read must not bring it back (`Pager.sweep`).
        self.paged: dict[str, str] = {}  # row key -> job id
        # Such jobs that left waiting and delayed (pulled, completed ...): once that change is
        # committed no read can bring them back, so no sweep looks at them, until one enters
        # waiting or delayed again (`ColdHead._entered`). Job id -> row key; pruned of the
        # jobs that left memory when it doubles (`parked_floor`).
        self.parked: dict[str, str] = {}
        self.parked_floor = 0


class Pager:
    """The reads of one engine's cold backlog (see the module docstring)."""

    def __init__(self, backlog: ColdBacklog, jobs: dict[str, Job], page_bytes: int) -> None:
        self.backlog = backlog
        self.jobs = jobs
        self.page_bytes = page_bytes
        # Row key -> (mark, record, or None for a tombstone).
        self.pending: dict[str, tuple[int, Record | None]] = {}
        # Jobs parked (`QueueHead.parked`) whose move out of waiting or delayed may not be
        # committed yet: (mark, head, row key, job id), watched by `sweep` until then.
        self.guards: list[tuple[int, QueueHead, str, str]] = []
        # Queue -> (mark, the states whose stored rows read as gone; None: every state).
        self.dropped: dict[str, tuple[int, frozenset[str] | None]] = {}
        self.epoch = 0

    def mark(self) -> int:
        """Name the mutations emitted so far; pass it to `committed` once they are stored."""
        self.epoch += 1
        return self.epoch - 1

    def committed(self, mark: int) -> None:
        """The mutations up to `mark` are committed: reads show them from now on."""
        if self.pending:
            for row in [r for r, (m, _) in self.pending.items() if m <= mark]:
                del self.pending[row]
        if self.guards:
            self.guards = [g for g in self.guards if g[0] > mark]
        if self.dropped:
            self.dropped = {q: d for q, d in self.dropped.items() if d[0] > mark}

    def drop(self, queue: str, states: frozenset[str] | None) -> None:
        """Every stored row of `queue` in `states` (None: in any state) was removed by the
        mutations emitted so far: reads hide them until that is committed. The kept records
        of the queue in those states are removed with them."""
        old = self.dropped.get(queue)
        if old is not None and states is not None:
            states = None if old[1] is None else old[1] | states
        epoch = self.epoch
        self.dropped[queue] = (epoch, states)
        pending = self.pending
        for row in [
            r
            for r, (_, rec) in pending.items()
            if rec is not None
            and rec.get("queue") == queue
            and (states is None or rec.get("state") in states)
        ]:
            pending[row] = (epoch, None)

    def gone(self, rec: Record) -> bool:
        """True if stored record `rec` is hidden by a queue's tombstone (`drop`)."""
        dropped = self.dropped.get(rec.get("queue"))  # type: ignore[arg-type]
        return dropped is not None and (dropped[1] is None or rec.get("state") in dropped[1])

    def keep(self, rec: Record) -> None:
        """A record the engine just sent cold."""
        # Slim: with a slow writer tens of thousands wait for their commit (module doc).
        self.pending[row_of(rec)] = (self.epoch, slim_record(rec))

    def sweep(self, heads: Iterable[QueueHead]) -> None:
        """Jobs paged in that have left memory since: tombstones until their commit, so a
        read that lags cannot bring one back. Runs before every read: it costs one test per
        job paged in that the engine holds waiting or delayed, or moved out of those states
        in writes not committed yet (`guards`); the others are parked, looked at no more."""
        jobs = self.jobs
        epoch = self.epoch
        for h in heads:
            if not h.paged:
                continue
            gone, settled = [], []
            for row, i in h.paged.items():
                job = jobs.get(i)
                if job is None or job.key != row:
                    gone.append(row)
                elif job.state != WAITING and job.state != DELAYED:
                    settled.append((row, i))
            for row in gone:
                # Over a kept record too: a job brought in from one and then removed (a
                # durable push forgotten when its commit failed) must not come back from it.
                del h.paged[row]
                self.pending[row] = (epoch, None)
            for row, i in settled:
                del h.paged[row]
                h.parked[i] = row
                self.guards.append((epoch, h, row, i))
            if len(h.parked) > 2 * h.parked_floor + 1024:
                h.parked = {i: r for i, r in h.parked.items() if _holds(jobs, i, r)}
                h.parked_floor = len(h.parked)
        if self.guards:
            kept = []
            for guard in self.guards:
                _, h, row, i = guard
                if _holds(jobs, i, row):
                    kept.append(guard)
                elif h.parked.get(i) == row:  # not back in `paged` (which sweeps it)
                    del h.parked[i]
                    self.pending[row] = (epoch, None)
            self.guards = kept

    # -- lookups by key ---------------------------------------------------------------------

    def record(self, job_id: str, queues: Sequence[str]) -> Record | None:
        """The cold record of job `job_id`: by row key, or as a custom id of one of
        `queues`; None if no cold job has that id. A kept record or tombstone of a row
        answers for it: the stored one may be stale."""
        pending = self.pending
        rows = [(job_id, None), *((f"{job_id}{ROW_KEY_SEP}{name}", name) for name in queues)]
        for row, queue in rows:
            if row in pending:
                rec = pending[row][1]
            else:
                if queue is None:
                    rec = self.backlog.get_job(job_id)
                else:
                    rec = self.backlog.get_by_custom_id(queue, job_id)
                if rec is not None and self.dropped and self.gone(rec):
                    continue
            if rec is not None and rec["id"] == job_id and is_cold(rec):
                return rec
        return None

    def unique(self, queue: str, key: str) -> list[Record]:
        """The stored and kept records of `queue` with uniqueKey `key`."""
        pending = self.pending
        found = [r for r in self.backlog.find_unique(queue, key) if row_of(r) not in pending]
        if self.dropped:
            found = [r for r in found if not self.gone(r)]
        for _, rec in pending.values():
            if rec is not None and rec.get("queue") == queue and rec.get("uniqueKey") == key:
                found.append(rec)
        return found

    # -- pages ------------------------------------------------------------------------------

    def walk(
        self,
        queue: str,
        read: Callable[[Cursor | None], ColdPage],
        key: Callable[[Job], Cursor],
        wanted: Callable[[Job], bool],
        desc: bool = False,
    ) -> Iterator[Job]:
        """The cold jobs of `queue` that `wanted` takes, in the order `read` pages the stored
        ones in (`key`: a job's cursor in that order; `desc`: `read` goes backwards), the kept
        records merged in; none is held. Lazy: a caller that stops early reads only the
        pages it consumed. The caller runs `sweep` first, and changes nothing the walk reads
        (kept records, tombstones, the jobs held) until it is done with it."""
        jobs = self.jobs
        kept: list[Job] = []
        for _, rec in self.pending.values():
            if rec is None or rec.get("queue") != queue or rec["id"] in jobs or not is_cold(rec):
                continue
            job = job_of(rec)
            if eligible(job) and wanted(job):
                kept.append(job)
        kept.sort(key=key, reverse=desc)
        stored = self._stored(read, wanted)
        return heapq.merge(kept, stored, key=key, reverse=desc) if kept else stored

    def _stored(
        self, read: Callable[[Cursor | None], ColdPage], wanted: Callable[[Job], bool]
    ) -> Iterator[Job]:
        """The stored jobs of `walk`: a row a kept record or tombstone answers for, or whose
        job is held, or that a queue's tombstone hides, is skipped."""
        jobs = self.jobs
        pending = self.pending
        after: Cursor | None = None
        while True:
            page = read(after)
            for rec in page.records:
                if row_of(rec) in pending or rec["id"] in jobs or not is_cold(rec):
                    continue
                if self.dropped and self.gone(rec):
                    continue
                rec.pop(COLD, None)  # a record read for this walk only: no copy needed
                job = Job.from_record(rec)
                if wanted(job):
                    yield job
            if page.done or page.after is None:
                return
            after = page.after

    def page(
        self, queue: str, state: str, cur: Cursor | None, limit: int
    ) -> tuple[list[Job], Cursor | None, bool]:
        """The next cold jobs of `queue` in `state` (waiting ungrouped, or delayed) after
        `cur`, in order: (jobs, the cursor after them or None if none moved, exhausted).
        A page of jobs held already (a read lagging) is read past. At most `limit` jobs:
        the kept records merged in (every job sent cold since the last commit, while the
        writer lags) are cut there too, and the cursor stops at the last job returned, so
        a refill of a few jobs never brings a whole uncommitted tail back in."""
        read = self.backlog.page_waiting if state == WAITING else self.backlog.page_delayed
        after = cur
        while True:
            page = read(queue, after, limit=limit, max_bytes=self.page_bytes)
            jobs = self._merge(page.records, page.after, page.done, cur, queue, state)
            if jobs or page.done or page.after is None:
                break
            after = page.after
        end = page.after if not page.done else None
        if len(jobs) > limit:
            del jobs[limit:]
            end = None  # the rest, stored or kept, sorts after the last job returned
        if jobs:
            last = (waiting_cursor if state == WAITING else delayed_cursor)(jobs[-1])
            end = last if end is None or last > end else end
        return jobs, end, page.done and not jobs

    def _merge(
        self,
        records: Sequence[Record],
        after: Cursor | None,
        done: bool,
        cur: Cursor | None,
        queue: str,
        state: str,
    ) -> list[Job]:
        """A page's jobs, with the kept records that sort within it merged in, in order."""
        jobs = self.jobs
        pending = self.pending
        out: list[Job] = []
        gone = self.gone if self.dropped else None
        for rec in records:
            if row_of(rec) in pending or rec["id"] in jobs or not is_cold(rec):
                continue
            if gone is not None and gone(rec):
                continue
            if rec["state"] == state:
                rec.pop(COLD, None)  # a record read for this page only: no copy needed
                out.append(Job.from_record(rec))
        key = waiting_cursor if state == WAITING else delayed_cursor
        for _, kept in pending.values():
            if kept is None or kept["id"] in jobs or kept.get("queue") != queue:
                continue
            if kept.get("state") != state or not is_cold(kept):
                continue
            job = job_of(kept)
            if not eligible(job):
                continue
            k = key(job)
            if (cur is None or k > cur) and (after is None or done or k <= after):
                out.append(job)
        out.sort(key=key)
        return out
