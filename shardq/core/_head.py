"""The head budget: each queue keeps its head in memory, the cold rest in the backlog.

With `EngineConfig.head_jobs` above 0 and a `ColdBacklog` (`_cold.py`), `ColdHead` keeps about
`head_jobs` waiting and `head_jobs` delayed jobs of each queue in memory; the others are cold,
stored only. With 0 (the default) nothing here exists: the engine installs the head by
replacing bound methods on the instances (`install`), never by a test on the hot path.

What is kept in memory, per queue (`QueueHead`):
- `wcur`: every cold ungrouped waiting job sorts after it (`waiting_cursor`); every job on
  the ready heap sorts at or before it. `dcur` is the same for delayed jobs. The queue's
  counts (`QueueState.counts`, `prioritized`) count cold jobs too, so every count stays
  O(1); `waiting`/`delayed`/`prioritized` here say how many of them are cold.
- A job entering waiting or delayed after the cursor while the queue has cold jobs goes
  straight off its heap and, at the end of the command (`settle`), to the backlog: its
  `put` gets `cold` 1, or an `("upd", key, {"cold": 1})` follows. A head above the budget
  drops its tail (the last quarter) the same way, and the cursor moves back to the last job
  it keeps. A head below half the budget pages the next jobs in (`page_waiting`,
  `page_delayed`), and a pull that empties the heap pages in before it answers.
- Lookups of a job the engine does not hold (`find`: GetJob, custom ids, uniqueKey owners,
  Promote, ChangePriority, ACK ...) bring it in from the backlog; unchanged at the end of the
  command, it leaves again without a write. Queue-wide commands read the backlog page by
  page without holding it (`_cold_wide.py`).

Only plain jobs go cold: a job with a group, a TTL, dependencies or a flow stays in memory
(`eligible`; one past the cursor pages the cold jobs before it in, `ahead`). Grouped heads
(`page_group`) are not paged yet.

Reads lag writes (a cold put is stored at the writer's next commit): the reads go through
`Pager` (`_pager.py`), which merges what the engine sent cold since, and tombstones of jobs
that left memory after a page-in, until told the commit holds them. The runtime calls:

    mark = engine.head.mark()          # when it hands the mutations so far to the writer
    ...                                # the writer commits that batch
    engine.head.committed(mark)        # the backlog reads now show all of it

The pager keeps at most the records of the mutations the writer has not committed, which
the writer's own batch bound limits. At start, `Engine.restore` gets the records that are not
cold (`cold` unset, or a state other than waiting and delayed: a job paged in and then
pulled keeps its cold row), then `engine.head.restore_cold(counts, now, max_seq=...)` gets
each queue's `cold_counts` and the highest stored seq.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ._cold import ColdBacklog, ColdCounts, delayed_cursor, waiting_cursor
from ._effects import Effects
from ._groups import group_of
from ._head_paging import HeadPaging
from ._job import Job
from ._lifecycle import DELAYED, TERMINAL_STATES, WAITING
from ._mutations import Mutation, Record
from ._pager import (
    COLD,
    Pager,
    QueueHead,
    as_stored,
    eligible,
    is_cold,
    last_puts,
    row_of,
)
from ._queue import QueueState
from ._record import fill_record
from ._state import JobStore
from ._tables import MIN_COMPACT

__all__ = ["ColdHead"]


class ColdHead(HeadPaging):
    """The head budget of one engine (see the module docstring)."""

    def __init__(self, store: JobStore, backlog: ColdBacklog) -> None:
        config = store.config
        self.store = store
        self.pager = Pager(backlog, store.jobs, config.head_page_bytes)
        self.budget = config.head_jobs
        self.low = max(1, config.head_jobs // 2)
        self.heads: dict[str, QueueHead] = {}
        # Jobs of this command taken off their heap to go cold; queues whose heads changed.
        self.leaving: list[Job] = []
        self.touched: set[str] = set()
        # Jobs that must stay in memory (`eligible`) and entered the queue's heap past its
        # cursor: `settle` pages the cold jobs before them in, to keep the order.
        self.ahead: list[Job] = []
        # Jobs brought in by a lookup, with their record: unchanged, they leave silently.
        self.looked_up: dict[str, Record] = {}
        # The delivery fencing of cold jobs that were delivered before (a retry, a move back):
        # not in their records, as after a restart; kept here up to `max_finalized` jobs.
        # (delivery, token, leased, queue): the queue names whose Drain forgets it.
        self.fences: OrderedDict[str, tuple[int, str | None, bool, str]] = OrderedDict()
        self.max_fences = config.max_finalized
        # Queue -> the seq of its last Drain's `qdrain`, until that is committed: a batch
        # resent to a restarted writer applies the range again, so a row of seq up to it
        # that goes cold waiting or delayed meanwhile gets a put (`_redrain`), which the
        # resent mutations re-apply after the range.
        self.drain_floors: dict[str, int] = {}
        self.reput: dict[str, Job] = {}
        self._enter_all: Callable[[Sequence[Job], QueueState, str], None] = store._enter_all

    # -- what the runtime calls ------------------------------------------------------------

    def mark(self) -> int:
        """Name the mutations emitted so far; pass it to `committed` once they are stored."""
        return self.pager.mark()

    def committed(self, mark: int) -> None:
        """The mutations up to `mark` are committed: reads show them from now on."""
        self.pager.committed(mark)

    def restore_cold(
        self, counts: Mapping[str, ColdCounts], now: int, *, max_seq: int
    ) -> list[Mutation]:
        """Take each queue's cold counts at start (after `Engine.restore` of the jobs that
        are not cold), page the heads in, and send hot jobs that sort after them cold.
        `max_seq` is the highest seq stored (cold jobs included): new jobs sort after it."""
        out: list[Mutation] = []
        store = self.store
        store.seq = max(store.seq, max_seq)
        for name, cold in counts.items():
            if not cold.waiting and not cold.delayed:
                continue
            q = store.queue(name)
            h = self.head(name)
            # The storage's waiting total counts grouped jobs too; none goes cold yet.
            grouped = sum(cold.group_waiting.values())
            h.waiting += cold.waiting - grouped
            h.delayed += cold.delayed
            # Cold waiting jobs with a priority: GetJobCounts reports them apart. A storage
            # whose counts lack it leaves them counted as plain waiting until paged in.
            prioritized = int(getattr(cold, "prioritized", 0) or 0)
            h.prioritized += prioritized
            q.prioritized += prioritized
            q.counts[WAITING] += cold.waiting - grouped
            q.counts[DELAYED] += cold.delayed
            # Up to the budget with the hot jobs the restore loaded (a head that fit before
            # the restart fits again): a budget more would send its tail straight back cold,
            # a write and a kept record per job. Hot jobs after the cursor still leave.
            self._page_waiting(q, h, 0)
            self._page_delayed(q, h, self.budget - (q.counts[DELAYED] - h.delayed))
            self._recheck(q, h)
        self.settle(out, now)
        return out

    def watch_restored(self, marked: Sequence[Record]) -> None:
        """Jobs restored from rows marked cold (`park_marked`): parked, or paged if they
        are waiting or delayed, as if paged in before the restart."""
        jobs = self.store.jobs
        for rec in marked:
            job, row = jobs.get(rec["id"]), rec["rowKey"]
            if job is not None and job.key == row:
                h = self.head(job.queue)
                if job.state == WAITING or job.state == DELAYED:
                    h.paged[row] = job.id
                else:
                    h.parked[job.id] = row

    def pending_count(self) -> int:
        """Records and tombstones kept until their commit is confirmed (for metrics)."""
        return len(self.pager.pending)

    def cold_total(self) -> int:
        """Cold jobs of every queue (for metrics)."""
        return sum(h.waiting + h.delayed for h in self.heads.values())

    def forget(self, names: Iterable[str]) -> None:
        """Queues that left this engine (`_handover.forget_queues`): their heads go too."""
        gone = [h for h in (self.heads.pop(name, None) for name in names) if h is not None]
        if gone and self.pager.guards:
            self.pager.guards = [g for g in self.pager.guards if g[1] not in gone]

    def cold_counts(self, queue: str) -> tuple[int, int]:
        """The queue's cold (waiting, delayed) jobs."""
        h = self.heads.get(queue)
        return (h.waiting, h.delayed) if h is not None else (0, 0)

    # -- installing ------------------------------------------------------------------------

    def install(self, consume: Any) -> None:
        """Put the head's hooks in place of the parts' methods (only under a budget)."""
        store = self.store
        store._enter_all = self._entered  # type: ignore[method-assign]
        store.find = self.find  # type: ignore[method-assign]
        store.queue = self._queue  # type: ignore[method-assign]
        self._queue_of = JobStore.queue.__get__(store)
        self._promote = consume.promote_due
        consume.promote_due = self.promote_due
        for q in store.queues.values():
            self._watch(q)

    def head(self, name: str) -> QueueHead:
        h = self.heads.get(name)
        if h is None:
            h = self.heads[name] = QueueHead()
        return h

    def _queue(self, name: str) -> QueueState:
        q = self.store.queues.get(name)
        if q is None:
            q = self._queue_of(name)
            self._watch(q)
        return q

    def _watch(self, q: QueueState) -> None:
        pop = q.pop_ready_many

        def pop_ready_many(count: int) -> list[Job]:
            taken = pop(count)
            h = self.heads.get(q.name)
            self.touched.add(q.name)
            while len(taken) < count and h is not None and h.waiting:
                if not self._page_waiting(q, h, count - len(taken) + self.low):
                    break
                taken += pop(count - len(taken))
            return taken

        q.pop_ready_many = pop_ready_many  # type: ignore[method-assign]

    # -- hooks -----------------------------------------------------------------------------

    def _entered(self, jobs: Sequence[Job], q: QueueState, state: str) -> None:
        """`JobStore._enter_all`, then: a job that sorts after the cursor leaves its heap."""
        self._enter_all(jobs, q, state)
        if state != WAITING and state != DELAYED:
            return
        self.touched.add(q.name)
        h = self.heads.get(q.name)
        if h is None:
            return
        if h.parked:
            self._unpark(h, jobs)
        if state == WAITING:
            if h.waiting:
                for job in jobs:
                    if h.wcur is None or waiting_cursor(job) > h.wcur:
                        if eligible(job):
                            job.hkey = None
                            self.leaving.append(job)
                        elif job.hkey is not None and group_of(job) is None:
                            self.ahead.append(job)  # grouped ones go after the queue's own
        elif h.delayed:
            for job in jobs:
                if eligible(job) and (h.dcur is None or delayed_cursor(job) > h.dcur):
                    job.dkey = None
                    self.leaving.append(job)

    def find(self, job_id: object) -> Job | None:
        """`JobStore.find`, and a job the engine does not hold is looked up in the backlog."""
        if not isinstance(job_id, str):
            return None
        job = self.store.jobs.get(job_id)
        if job is not None or not self.heads:
            return job
        return self.look_up(job_id, None)

    def look_up(self, job_id: str, queue: str | None) -> Job | None:
        """Bring cold job `job_id` in (it leaves again at `settle` if nothing changed it)."""
        rec = self._cold_record(job_id, queue)
        if rec is None:
            return None
        job = self._bring_in(rec)
        if job is not None:
            self.looked_up[job.id] = rec
        return job

    def _cold_record(self, job_id: str, queue: str | None) -> Record | None:
        heads = self.heads
        names = [n for n in ([queue] if queue else heads) if n in heads]
        self.pager.sweep(heads.values())
        return self.pager.record(job_id, [n for n in names if heads[n].waiting or heads[n].delayed])

    def owner_of(self, queue: str, key: str) -> Job | None:
        """The cold job that holds uniqueKey `key` of `queue` (after a start, when the claim
        is not in memory), brought in; None if no cold job holds it."""
        h = self.heads.get(queue)
        if h is None or not (h.waiting or h.delayed or h.paged):
            return None
        self.pager.sweep(self.heads.values())
        found = self.pager.unique(queue, key)
        # A job paged in since the start holds its cold row and no claim either.
        jobs = self.store.jobs
        live = [
            r for r in found if is_cold(r) or getattr(jobs.get(r["id"]), "key", None) == row_of(r)
        ]
        if not live:
            return None
        owner = max(live, key=lambda r: int(r["seq"]))
        held = jobs.get(owner["id"])
        if held is not None and held.key == row_of(owner):
            return held if held.state not in TERMINAL_STATES else None
        return self.look_up(owner["id"], queue)

    def promote_due(self, fx: Effects, now: int) -> None:
        """`Consumer.promote_due`, and the cold delayed jobs due by now too."""
        self._promote(fx, now)
        while True:
            due = [
                name
                for name, h in self.heads.items()
                if h.delayed and (h.dcur is None or h.dcur[0] <= now)
            ]
            paged = 0
            for name in due:
                q = self.store.queues.get(name)
                if q is not None:
                    paged += self._page_delayed(q, self.heads[name], self.budget)
            if not paged:
                return
            self._promote(fx, now)

    # -- the end of each command -----------------------------------------------------------

    def settle(self, out: list[Mutation], now: int) -> None:
        """After a command or a tick: send the jobs that must go cold, trim heads above the
        budget and page in heads below half of it."""
        leaving, self.leaving = self.leaving, []
        looked, self.looked_up = self.looked_up, {}
        touched, self.touched = self.touched, set()
        puts: dict[str, Record] | None = None
        jobs = self.store.jobs
        if self.reput:
            self._reput(out)
        for job_id, rec in looked.items():
            job = jobs.get(job_id)
            if job is not None and self._unchanged(job, rec):
                self._drop(job, write=False)  # its row is what it was: no write
        going: list[Job] = []
        for job in leaving:
            if self._must_leave(job):
                going.append(job)
            elif jobs.get(job.id) is job:
                self._back_on_heap(job)
        for job in going:
            if jobs.get(job.id) is job:
                puts = self._evict(out, job, puts)
        if self.ahead:
            self._page_up_to()
        for name in touched:
            q = self.store.queues.get(name)
            if q is None:
                self.heads.pop(name, None)
                continue
            puts = self._trim(out, q, puts)
            h = self.heads.get(name)
            if h is not None:
                self._refill(q, h)

    def _page_up_to(self) -> None:
        """Page in the cold jobs that sort before each job of `ahead` (see there)."""
        ahead, self.ahead = self.ahead, []
        for job in ahead:
            q = self.store.queues.get(job.queue)
            h = self.heads.get(job.queue)
            if q is None or h is None or self.store.jobs.get(job.id) is not job:
                continue
            key = waiting_cursor(job)
            while h.waiting and (h.wcur is None or key > h.wcur):
                if not self._page_waiting(q, h, self.budget):
                    break

    def _must_leave(self, job: Job) -> bool:
        if self.store.jobs.get(job.id) is not job or not eligible(job):
            return False
        h = self.heads.get(job.queue)
        if h is None:
            return False
        if job.state == WAITING:
            if job.hkey is not None:
                return False
            return bool(h.waiting) and (h.wcur is None or waiting_cursor(job) > h.wcur)
        if job.state == DELAYED:
            if job.dkey is not None:
                return False
            return bool(h.delayed) and (h.dcur is None or delayed_cursor(job) > h.dcur)
        return False

    def _back_on_heap(self, job: Job) -> None:
        if job.state == WAITING and job.hkey is None and job.id not in self.store.held:
            self.store.queues[job.queue].push_ready_all((job,))
        elif job.state == DELAYED and job.dkey is None:
            key = (job.run_at, job.seq, job.id)
            job.dkey = key
            heapq.heappush(self.store.delayed, key)

    def _unchanged(self, job: Job, rec: Record) -> bool:
        if job.state not in (WAITING, DELAYED) or not eligible(job):
            return False
        if job.hkey is not None or job.dkey is not None or job.id in self.store.held:
            return False  # placed in the head (its cursor moved past it), or held
        if not self._must_leave(job):
            return False
        old = {k: v for k, v in rec.items() if k != COLD}
        # Either may leave out fields at their default (`_record`): compared whole.
        return bool(as_stored(fill_record(job.to_record())) == as_stored(fill_record(old)))

    def _evict(
        self, out: list[Mutation], job: Job, puts: dict[str, Record] | None
    ) -> dict[str, Record]:
        """Send a held job to the backlog: its put in this command is marked, or an update
        marks its row."""
        if puts is None:
            puts = last_puts(out)
        put = puts.get(job.id)
        if put is not None:
            put[COLD] = 1  # the record the job was just put with: kept as it is
            rec = self._drop(job, write=True, rec=put)
        elif self.drain_floors and self._redrain(job):
            rec = self._drop(job, write=True)
            out.append(("put", rec))
        else:
            rec = self._drop(job, write=True)
            out.append(("upd", job.key, {COLD: 1}))
        self.pager.keep(rec)
        return puts

    def _unpark(self, h: QueueHead, jobs: Sequence[Job]) -> None:
        if self.drain_floors:
            self.reput.update((j.id, j) for j in jobs if j.id in h.parked and self._redrain(j))
        _unpark(h, jobs)

    def _redrain(self, job: Job) -> bool:
        """True if a `qdrain` not committed yet could meet `job`'s row, were its batch
        resent (`drain_floors`): its cold row must then come from a put."""
        floor = self.drain_floors.get(job.queue)
        if floor is None:
            return False
        if job.queue not in self.pager.dropped:  # committed: never resent again
            del self.drain_floors[job.queue]
            return False
        return job.seq <= floor

    def _reput(self, out: list[Mutation]) -> None:
        """Puts of the jobs `_entered` found back in waiting or delayed over a cold row
        that a resent `qdrain` would meet (`drain_floors`)."""
        reput, self.reput = self.reput, {}
        jobs = self.store.jobs
        for job in reput.values():
            if jobs.get(job.id) is job:
                rec = job.to_record()
                rec[COLD] = 1
                out.append(("put", rec))

    def _drop(self, job: Job, *, write: bool, rec: Record | None = None) -> Record:
        """Take a waiting or delayed job out of memory; it stays counted, as cold. `rec`:
        its record as this command put it, if it did (no other mutation of it follows)."""
        store = self.store
        q = store.queues[job.queue]
        h = self.head(job.queue)
        if rec is None:
            rec = job.to_record()
            if write:
                rec[COLD] = 1
        if job.state == WAITING:
            h.waiting += 1
            if job.priority > 0:
                h.prioritized += 1
            job.hkey = None
        else:
            h.delayed += 1
            job.dkey = None
        if job.delivery:
            self.fences[job.id] = (job.delivery, job.token, job.leased, job.queue)
            if len(self.fences) > self.max_fences:
                self.fences.popitem(last=False)
        del store.jobs[job.id]
        q.ids.pop(job.id, None)
        h.paged.pop(job.key, None)
        return rec

    def _trim(self, out: list[Mutation], q: QueueState, puts: dict[str, Record] | None) -> Any:
        """Drop the tail of a head above the budget: the last quarter leaves."""
        h = self.heads.get(q.name)
        hot = q.counts[WAITING] - (h.waiting if h else 0)
        # The ready heap holds ungrouped jobs only (and dead entries): under the budget, no
        # scan. After one it holds its live entries only, so the next is as cheap.
        if hot > self.budget and q.ready_len() > self.budget:
            jobs = self.store.jobs
            live = sorted(k for k in q.ready if q._owns(k))
            # The cut falls after the last job that must stay in memory (a TTL, a flow):
            # every job past the cursor is cold.
            cut = self.budget - self.budget // 4
            for i in range(len(live) - 1, cut - 1, -1):
                if not eligible(jobs[live[i][-1]]):
                    cut = i + 1
                    break
            tail = [jobs[k[-1]] for k in live[cut:]]
            if tail:
                h = h or self.head(q.name)
                h.wcur = waiting_cursor(jobs[live[cut - 1][-1]])
                for job in tail:
                    puts = self._evict(out, job, puts)
            q.ready = [k for k in live if q._owns(k)]  # sorted: a heap
        elif q.ready_len() > 2 * max(hot, self.budget) + MIN_COMPACT:
            # Jobs sent cold leave dead entries (their push put them on the heap first); the
            # queue compacts against its counts, which count them, so it is done here.
            q.ready = [k for k in q.ready if q._owns(k)]
            heapq.heapify(q.ready)
        hot = q.counts[DELAYED] - (h.delayed if h else 0)
        if hot > self.budget and hot > (h.dfloor if h else 0) + self.budget // 4:
            puts = self._trim_delayed(out, q, puts, hot)
        return puts

    def _trim_delayed(self, out: list[Mutation], q: QueueState, puts: Any, hot: int) -> Any:
        """As `_trim`, over the shard's delayed heap. A scan that finds nothing to send
        (the queue's delayed jobs have groups or TTLs) raises the floor the next must pass."""
        jobs = self.store.jobs
        live = []
        for k in self.store.delayed:
            job = jobs.get(k[-1])
            if job is not None and job.dkey is k and job.queue == q.name:
                live.append(k)
        keep = self.budget - self.budget // 4
        if len(live) <= keep:
            return puts
        live.sort()
        tail = [jobs[k[-1]] for k in live[keep:] if eligible(jobs[k[-1]])]
        h = self.head(q.name)
        h.dfloor = 0 if tail else hot
        if tail:
            h.dcur = delayed_cursor(jobs[live[keep - 1][-1]])
            for job in tail:
                puts = self._evict(out, job, puts)
        return puts

    def _refill(self, q: QueueState, h: QueueHead) -> None:
        # Up to the budget, not a budget more: a head paged past it would send its tail
        # straight back cold (`_trim`), a write per job, and page it in again.
        hot = q.counts[WAITING] - h.waiting
        if h.waiting and hot < self.low:
            self._page_waiting(q, h, self.budget - hot)
        hot = q.counts[DELAYED] - h.delayed
        if h.delayed and hot < self.low:
            self._page_delayed(q, h, self.budget - hot)

    def _recheck(self, q: QueueState, h: QueueHead) -> None:
        """At start: hot jobs that sort after the cursors leave their heaps (`settle`)."""
        jobs = self.store.jobs
        for k in list(q.ready):
            job = jobs.get(k[-1])
            if job is not None and job.hkey is k:
                if not eligible(job):
                    self.ahead.append(job)  # stays; the cold jobs before it come in
                    continue
                job.hkey = None
                self.leaving.append(job)  # `settle` puts back what sorts within the head
        for k in list(self.store.delayed):
            job = jobs.get(k[-1])
            if job is not None and job.dkey is k and job.queue == q.name:
                job.dkey = None
                self.leaving.append(job)


def _unpark(h: QueueHead, jobs: Sequence[Job]) -> None:
    """Jobs from cold rows back in waiting or delayed: their rows read cold again once that
    is committed, so the sweeps watch them again (`QueueHead.parked`)."""
    parked, paged = h.parked, h.paged
    for job in jobs:
        row = parked.pop(job.id, None)
        if row is not None and row == job.key:
            paged[row] = job.id
