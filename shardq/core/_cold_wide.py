"""Queue-wide commands under a head budget, without paging the cold backlog in.

Under a head budget (`_head.py`) a queue holds its head in memory and the rest cold, in
storage. The commands that read or change every job of a queue (`WIDE`) answer here from the
head they hold plus bounded reads of the backlog, never by bringing the whole backlog into
memory: whatever the backlog's size, a command holds at most one page of cold jobs at a time
(`head_jobs` records and `head_page_bytes`), plus what its reply names.

- **GetJobs**: the held jobs that match, merged with the `offset + limit` first cold ones in
  the command's order (created at, then seq), read in that order off the storage's index of
  the cold backlog by creation time (`page_made`), backwards for a descending page: memory
  and reads O(offset + limit) (plus the held jobs a read skips, and the jobs a name filter
  turns down), whatever the backlog.
- **GetCountsPerPriority**: the held jobs' counts plus the storage's count of the cold ones
  by priority (a GROUP BY over the cold indexes), corrected by key for the rows a read would
  not take as they are stored (kept records, tombstones, jobs held): no record is paged.
- **PromoteJobs**: pages in only the delayed jobs it promotes (cold delayed jobs all sort
  after the held ones, `QueueHead.dcur`), until `count` of them are held.
- **Clean** (waiting or delayed): the first `limit` matching jobs by seq, the cold ones read
  in seq order off the storage's index, only those created `grace` or more ago
  (`page_by_seq`, which skips the younger ones in the index): reads O(limit). Those removed
  are deleted by key, each leaving a tombstone until the deletion is committed.
- **Drain**: the held jobs are removed as without a budget; the cold ones with one range
  deletion, `("qdrain", queue, seq)` (`shardq.storage._drain`): the queue's cold waiting and
  delayed rows of seq up to the engine's counter. Nothing is read: the count is the queue's
  cold count, the uniqueKey claims and delivery fences of the cold jobs are dropped from
  their tables (bounded by `max_dedup_keys` and `max_finalized`), one tombstone for the queue
  (`Pager.drop`) hides the stored rows until the commit, and until then a job the range could
  meet in a resent batch is written whole (`ColdHead.drain_floors`).
- **Obliterate**: the writer's `qdel` deletes the queue's rows, cold ones too: nothing is read
  but the owners of the queue's uniqueKey claims that are not held (their claims go with them);
  one tombstone for the queue hides its stored rows until the `qdel` is committed.

Every command keeps the queue's counts exact: a cold job removed leaves the cold count
(`QueueHead`) and the queue's count together. The reads go through the head's `Pager`, so
they merge what the engine sent cold and has not seen committed, as every page-in does.
Clean emits one `del` per cold job it removes (the job's row key, no record): the mutations
grow with the jobs removed (at most its `limit`), the jobs held in memory do not; Drain emits
one `qdrain` whatever the backlog.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any, Final

from ._admin import _CLEAN_STATES, _finished_at
from ._cold import delayed_cursor
from ._effects import Effects
from ._job import Job
from ._lifecycle import DELAYED, WAITING
from ._mutations import Record
from ._options import as_int
from ._pager import MAX_LIMIT, QueueHead, eligible, is_cold, job_of
from ._query import _wanted_states, job_view
from ._queue import QueueState
from ._tables import release_unique

if TYPE_CHECKING:
    from ._head import ColdHead

__all__ = ["WIDE", "ColdWide"]

WIDE: Final = frozenset(
    {
        "GetJobs",
        "GetCountsPerPriority",
        "Drain",
        "Clean",
        "Obliterate",
        "PromoteJobs",
    }
)
"""Commands that read or change every job of a queue: answered here under a budget."""

SCAN_PAGE: Final = (64, 1000)
"""Records per read of a scan: `head_jobs`, within these bounds, and at most `head_page_bytes`
stored bytes. The cold jobs a queue-wide command holds at once, decoded (a few KB each in
Python objects: a page of 1,000 jobs of 400-byte data raised a shard's peak by 8 to 17 MB,
one of 200 by 1 MB); none joins the head."""

Handler = Callable[[Effects, Mapping[str, Any], int], dict[str, Any]]
_BOTH: Final = frozenset((WAITING, DELAYED))
# The public states cold jobs can have (GetJobs' filter), as the storage's reads name them;
# and those of each state.
_KINDS: Final = ("waiting", "prioritized", "delayed")
_STATE_KINDS: Final = {WAITING: ("waiting", "prioritized"), DELAYED: ("delayed",)}


def _counted(rec: Record) -> bool:
    """A record a page of cold waiting (ungrouped) or delayed jobs takes."""
    if not is_cold(rec):
        return False
    return rec.get("state") == DELAYED or rec.get("groupId") is None


def _seq(job: Job) -> int:
    return job.seq


def _made(job: Job) -> tuple[int, int, str]:
    return (job.created_at, job.seq, job.key)


def _by_seq(job: Job) -> tuple[int, str]:
    return (job.seq, job.key)


class ColdWide:
    """The queue-wide commands of one engine under a head budget (module docstring)."""

    def __init__(self, head: ColdHead) -> None:
        self.head = head
        self.store = head.store
        self.originals: dict[str, Handler] = {}

    def wrap(self, name: str, handler: Handler) -> Handler:
        """The handler of queue-wide command `name` under the budget (`handler`: the
        engine's own, which it runs for the jobs held in memory)."""
        self.originals[name] = handler
        ours: dict[str, Handler] = {
            "GetJobs": self.get_jobs,
            "GetCountsPerPriority": self.counts_per_priority,
            "PromoteJobs": self.promote_jobs,
            "Clean": self.clean,
            "Drain": self.drain,
            "Obliterate": self.obliterate,
        }
        return ours[name]

    # -- reading the backlog ---------------------------------------------------------------

    def _cold(self, name: object) -> tuple[QueueState, QueueHead] | None:
        """The queue `name` and its head if it has cold jobs; the held jobs are put in
        admission order first, as an engine without a budget holds them."""
        if not isinstance(name, str):
            return None
        q = self.store.queues.get(name)
        h = self.head.heads.get(name)
        if q is None or h is None:
            return None
        if h.paged or h.parked:
            jobs = self.store.jobs
            ordered = sorted(q.ids, key=lambda i: jobs[i].seq)
            q.ids.clear()
            q.ids.update(dict.fromkeys(ordered))
        return (q, h) if h.waiting or h.delayed else None

    def _forget(self, fx: Effects, q: QueueState, h: QueueHead, job: Job) -> None:
        """Remove cold job `job` (not held): its counts, its claim, its row."""
        if job.state == WAITING:
            h.waiting -= 1
            q.counts[WAITING] -= 1
            self.head._uncount_priority(q, h, job)
        else:
            h.delayed -= 1
            q.counts[DELAYED] -= 1
        self.head.fences.pop(job.id, None)
        release_unique(self.store, job, force=True)
        fx.mutations.append(("del", job.key))

    def _uncursor(self, h: QueueHead) -> None:
        if not h.waiting:
            h.wcur = None
        if not h.delayed:
            h.dcur = None

    # -- the commands ----------------------------------------------------------------------

    def get_jobs(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        cold = self._cold(cmd.get("queue"))
        wanted = _wanted_states(cmd.get("state"))
        kinds = [k for k in _KINDS if wanted is None or k in wanted]
        if cold is None or not kinds:
            return self.originals["GetJobs"](fx, cmd, now)
        q = cold[0]
        text = cmd.get("name")
        text = text if isinstance(text, str) and text else None

        def fits(job: Job) -> bool:
            if wanted is not None and job.public_state() not in wanted:
                return False
            return text is None or text in job.name

        jobs = self.store.jobs
        held = [(j.created_at, j.seq, j) for i in q.ids if fits(j := jobs[i])]
        desc = cmd.get("asc") is False
        offset = max(as_int(cmd.get("offset"), 0), 0)
        limit = max(as_int(cmd.get("limit"), 100), 0)
        first = offset + limit
        # The first `offset + limit` cold jobs in the command's order, read in that order
        # through the storage's index (`page_made`): a deep page keeps (created at, seq, id)
        # of these, not the jobs; the page's own jobs are read again by key.
        top: list[tuple[int, int, str]] = []
        if first:
            walk = self._walk(q, "page_made", kinds, _made, fits, desc=desc, size=first)
            top = [(j.created_at, j.seq, j.id) for j in islice(walk, first)]
        page = sorted(held + top, reverse=desc)[offset:first]  # type: ignore[operator]
        return {"ok": True, "jobs": [job_view(self._job(q, entry[2])) for entry in page]}

    def _walk(
        self,
        q: QueueState,
        read: str,
        kinds: list[str],
        key: Callable[[Job], tuple[Any, ...]],
        wanted: Callable[[Job], bool],
        *,
        size: int,
        desc: bool = False,
        made_by: int | None = None,
    ) -> Iterator[Job]:
        """The cold jobs of `q` of the public states `kinds` that `wanted` takes, in the order
        of the storage's read `read` ("page_made": GetJobs' order, reversed if `desc`;
        "page_by_seq": by seq, created at or before `made_by`), pages of about `size` jobs
        (within `SCAN_PAGE`), the kept records merged in (`Pager.walk`)."""
        head = self.head
        pager = head.pager
        pager.sweep(head.heads.values())
        size = min(MAX_LIMIT, max(SCAN_PAGE[0], min(SCAN_PAGE[1], size)))
        backlog, fences, name = pager.backlog, head.fences, q.name

        def page(after: tuple[Any, ...] | None) -> Any:
            bytes_ = pager.page_bytes
            if read == "page_made":
                return backlog.page_made(
                    name, kinds, after, limit=size, desc=desc, max_bytes=bytes_
                )
            return backlog.page_by_seq(
                name, kinds, after, limit=size, made_by=made_by, max_bytes=bytes_
            )

        for job in pager.walk(name, page, key, wanted, desc):
            fence = fences.get(job.id) if fences else None
            if fence is not None:
                job.delivery, job.token, job.leased, _ = fence
            yield job

    def _job(self, q: QueueState, job: Job | str) -> Job:
        """`job`, or the cold job of `q` with id `job` read back by key."""
        if isinstance(job, Job):
            return job
        rec = self.head.pager.record(job, [q.name])
        assert rec is not None, f"cold job {job} of {q.name} vanished within a command"
        found = job_of(rec)
        fence = self.head.fences.get(found.id)
        if fence is not None:
            found.delivery, found.token, found.leased, _ = fence
        return found

    def counts_per_priority(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        reply = self.originals["GetCountsPerPriority"](fx, cmd, now)
        cold = self._cold(cmd.get("queue"))
        if cold is not None:
            counts: dict[str, int] = reply["counts"]
            for priority, n in self._cold_priorities(*cold).items():
                if n:
                    key = str(priority)
                    counts[key] = counts.get(key, 0) + n
        return reply

    def _cold_priorities(self, q: QueueState, h: QueueHead) -> dict[Any, int]:
        """The queue's cold jobs by priority: the storage's count over its cold index, less
        the stored rows a read would not take as cold now (a kept record or tombstone
        replaces them, or their job is held: paged in, or moved on in writes not committed),
        plus the kept records of cold jobs (as `Pager.page` merges them)."""
        head = self.head
        pager = head.pager
        pager.sweep(head.heads.values())
        backlog = pager.backlog
        if q.name in pager.dropped:
            # A queue's tombstone (Drain, Obliterate) hides its stored waiting and delayed rows.
            counts: dict[Any, int] = {}
        else:
            counts = dict(backlog.cold_priorities(q.name))
            rows = {*pager.pending, *h.paged}
            rows.update(g[2] for g in pager.guards if g[1] is h)
            for row in rows:
                rec = backlog.get_job(row)
                if rec is not None and rec.get("queue") == q.name and _counted(rec):
                    key = rec.get("priority") or 0
                    counts[key] = counts.get(key, 0) - 1
        jobs = self.store.jobs
        for _, rec in pager.pending.values():
            if rec is None or rec.get("queue") != q.name or rec["id"] in jobs:
                continue
            if _counted(rec) and eligible(job_of(rec)):
                key = rec.get("priority") or 0
                counts[key] = counts.get(key, 0) + 1
        return counts

    def promote_jobs(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        cold = self._cold(cmd.get("queue"))
        if cold is not None:
            q, h = cold
            count = as_int(cmd.get("count"), 1000)
            jobs = self.store.jobs
            # Every cold delayed job sorts after `dcur`: once `count` held ones sort at or
            # before it, they are the first `count`.
            while h.delayed and count > 0:
                cur = h.dcur
                ahead = 0
                if cur is not None:
                    for i in q.ids:
                        job = jobs[i]
                        if job.state == DELAYED and delayed_cursor(job) <= cur:
                            ahead += 1
                if ahead >= count or not self.head._page_delayed(q, h, count - ahead):
                    break
        return self.originals["PromoteJobs"](fx, cmd, now)

    def clean(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        state = cmd.get("state")
        states = _CLEAN_STATES.get(state, ()) if state is None or isinstance(state, str) else ()
        cold = self._cold(cmd.get("queue"))
        if cold is None or _BOTH.isdisjoint(states):
            return self.originals["Clean"](fx, cmd, now)
        q, h = cold
        grace = as_int(cmd.get("grace"), 0)
        limit = max(as_int(cmd.get("limit"), 1000), 0)
        jobs = self.store.jobs
        held = [
            j for i in q.ids if (j := jobs[i]).state in states and now - _finished_at(j) >= grace
        ]
        held.sort(key=_seq)
        # A cold job is waiting or delayed: it finished at its creation (`_finished_at`).
        # The first `limit` of them by seq created at or before `now - grace`, read in that
        # order through the storage's index (`page_by_seq`).
        kinds = [k for s in states if s in _BOTH for k in _STATE_KINDS[s]]

        def old_enough(job: Job) -> bool:
            return job.state in states and now - job.created_at >= grace

        found: list[Job] = []
        if limit:
            walk = self._walk(
                q, "page_by_seq", kinds, _by_seq, old_enough, size=limit, made_by=now - grace
            )
            found = list(islice(walk, limit))
        chosen = sorted(held[:limit] + found, key=_seq)
        ids: list[str] = []
        pending = self.head.pager.pending
        epoch = self.head.pager.epoch
        for job in chosen[:limit]:
            ids.append(job.id)
            if jobs.get(job.id) is job:
                self.store.move(fx, job, "remove", now, {})
            else:
                self._forget(fx, q, h, job)
                pending[job.key] = (epoch, None)  # the stored row reads as gone
        self._uncursor(h)
        return {"ok": True, "count": len(ids), "ids": ids}

    def drain(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        reply = self.originals["Drain"](fx, cmd, now)
        cold = self._cold(cmd.get("queue"))
        if cold is None:
            return reply
        q, h = cold
        head = self.head
        head.pager.sweep(head.heads.values())
        removed = h.waiting + h.delayed
        self._forget_queue(q.name)
        # One range deletion for every cold row: every job the engine has has a seq up to
        # its counter, and one pushed after the drain a higher one.
        seq = self.store.seq
        fx.mutations.append(("qdrain", q.name, seq))
        head.drain_floors[q.name] = seq
        q.counts[WAITING] -= h.waiting
        q.counts[DELAYED] -= h.delayed
        q.prioritized -= h.prioritized
        h.waiting = h.delayed = h.prioritized = 0
        self._uncursor(h)
        head.pager.drop(q.name, _BOTH)
        reply["count"] = int(reply["count"]) + removed
        return reply

    def _forget_queue(self, name: str) -> None:
        """The uniqueKey claims and delivery fences of the queue's cold jobs, which a Drain
        removes: every job of the queue not held is one (the held ones were drained or stay
        held), so these are read off the claim and fence tables, bounded by
        `max_dedup_keys` and `max_finalized`, not off the backlog."""
        jobs, unique, fences = self.store.jobs, self.store.unique, self.head.fences
        for key in [k for k, owner in unique.items() if k[0] == name and owner not in jobs]:
            del unique[key]
        for job_id in [i for i, f in fences.items() if f[3] == name and i not in jobs]:
            del fences[job_id]

    def obliterate(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        name = str(cmd.get("queue", ""))
        head = self.head
        if name in head.heads:
            self._release_claims(name)
            head.pager.drop(name, None)
            head.forget([name])
        return self.originals["Obliterate"](fx, cmd, now)

    def _release_claims(self, name: str) -> None:
        """The uniqueKey claims of the queue's cold jobs (an obliterate removes them)."""
        store = self.store
        pager = self.head.pager
        pager.sweep(self.head.heads.values())
        for ukey, owner in [(k, v) for k, v in store.unique.items() if k[0] == name]:
            if owner in store.jobs:
                continue  # held: the obliterate releases it
            rec = pager.record(owner, [name])
            if rec is not None and rec.get("queue") == name and rec.get("uniqueKey") == ukey[1]:
                del store.unique[ukey]
