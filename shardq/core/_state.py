"""The job store: the one owner of one shard's jobs, and the only code that changes their state.

`JobStore` holds every table of the jobs (the jobs, the queues, the heaps, the leases, the
uniqueKey claims, the memory of completed jobs) and the primitives every operation uses to
change them: `admit`, `admit_all`, `move`, `move_all`, `remove`, `dead`, `revive`. They keep
the counts, heaps, indexes and the mutation stream consistent in one place. The bookkeeping
over the tables that changes no job's state is functions in `_tables.py`; the dependencies
and the dead letters (`dead`, `cap_dlq`) are a base class in `_deps_dlq.py`.

The job operations (produce, consume, control, admin, query, introspect, timers) and the
feature components (limits, groups, flows, dead letters, cron) are components that hold the
store (`_engine.py` builds them). The store calls back into three of them where one of its
jobs concerns them, typed by the protocols in `_parts.py`: the limiter (an active job of a
blocked queue ended), the flows (a parent is admitted, a child finished) and the dead letters
(a job entered a queue's DLQ).
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

from shardq.errors import CommandError

from ._config import EngineConfig
from ._deps_dlq import DepsAndDeadLetters
from ._effects import Effects
from ._fresh import DURABLE_ONLY, FreshRecords
from ._ids import IdFactory
from ._job import Job, Timeline
from ._lifecycle import (
    ACTIVE,
    COMPLETED,
    DELAYED,
    FAILED,
    REMOVED,
    WAITING,
    WAITING_CHILDREN,
    next_state,
)
from ._mutations import Mutation
from ._order import CompletedOrder
from ._parts import DeadLetterPart, FlowPart, LimiterPart
from ._queue import QueueState
from ._tables import (
    MIN_COMPACT,
    Lease,
    claim_unique,
    delivery_key,
    extended,
    release_unique,
    remember_completion,
)

__all__ = ["Changes", "JobStore", "Lease", "delivery_key"]

# The changes of a batch move: one dict per job, or one dict for all of them.
Changes: TypeAlias = Sequence[dict[str, Any]] | dict[str, Any]


class JobStore(DepsAndDeadLetters):
    """One shard's jobs: their tables and the primitives that change a job's state."""

    # The components this store tells about its jobs, set by `Engine` (`_engine.py`) once it
    # has built them: the queue limits (an active job of a blocked queue ended) and the flows
    # (a parent is admitted, a child finished), the dead letters (a job entered a queue's DLQ).
    limiter: LimiterPart
    flows: FlowPart
    dead_letters: DeadLetterPart

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.rng = random.Random(seed)
        self.ids = IdFactory(self.rng)
        self.fresh = FreshRecords()  # admitted jobs' records, encoded as they are made
        self.seq = 0
        self.jobs: dict[str, Job] = {}
        self.queues: dict[str, QueueState] = {}
        self.delayed: list[tuple[Any, ...]] = []
        self.delayed_watermark = MIN_COMPACT
        self.leases: dict[str, Lease] = {}
        self.lease_heap: list[tuple[Any, ...]] = []
        self.lease_entries = 0
        self.timeouts: list[tuple[int, str, int]] = []
        self.ttl_heap: list[tuple[int, str, int]] = []
        self.unleased: dict[str, None] = {}
        self.conn_jobs: dict[str, dict[str, int]] = {}
        self.job_conn: dict[str, str] = {}
        # Jobs kept active at their connection's close (a renewed lease, docs/protocol.md
        # §2.6), each with the lease record it had then: a later renewal replaces the record.
        self.orphans: dict[str, Lease] = {}
        self.orphans_checked_at = 1024  # `_renew._prune_orphans`
        self.unique: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.dependents: dict[str, set[str]] = {}
        # Completed jobs held, oldest first (evicted past config.max_completed, rows included).
        self.completed_order = CompletedOrder()
        self.results_order: OrderedDict[str, None] = OrderedDict()
        # Ids of completed jobs no longer in memory, for dependsOn, oldest first (bounded).
        self.dep_done: dict[str, None] = {}
        self.dep_done_order: deque[str] = deque()
        self.finalized: OrderedDict[str, str] = OrderedDict()
        # Jobs of durable pushes whose commit is not confirmed yet: never delivered (`hold`).
        self.held: set[str] = set()
        # While a durable PUSHB runs (the shard sets it): its jobs are held as they are
        # admitted, so never put on the ready heap before their commit, and listed here.
        self.holding: list[str] | None = None
        # Under a head budget (`_head.py`): bring a cold job in by id (and queue, for a
        # custom id), or the cold owner of a uniqueKey; None without a budget.
        self.cold_lookup: Callable[[str, str | None], Job | None] | None = None
        self.cold_owner: Callable[[str, str], Job | None] | None = None

    def queue(self, name: str) -> QueueState:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueState(name, self.jobs, held=self.held)
        return q

    def find(self, job_id: object) -> Job | None:
        return self.jobs.get(job_id) if isinstance(job_id, str) else None

    def job_or_error(self, job_id: object, message: str) -> Job:
        job = self.find(job_id)
        if job is None:
            raise CommandError(message)
        return job

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def finalize(self, job: Job) -> None:
        """Remember a retired delivery so its late ACK gets "already-finalized"."""
        self.finalized[delivery_key(job)] = job.id
        if len(self.finalized) > self.config.max_finalized:
            self.finalized.popitem(last=False)

    def is_completed(self, job_id: str) -> bool:
        job = self.jobs.get(job_id)
        if job is not None:
            return job.state == COMPLETED
        if job_id not in self.dep_done:
            return False
        # Under a head budget a later generation of a custom id may be cold.
        return self.cold_lookup is None or self.find(job_id) is None

    # -- what the writer could not store yet ----------------------------------------------

    def hold(self, job_ids: Iterable[str]) -> None:
        """Keep these jobs (just pushed) from delivery until `confirm`: their push is durable
        and not committed yet, and a job that ran must not vanish in a crash. They stay
        waiting (counted, readable) but off the ready heap."""
        held, jobs = self.held, self.jobs
        for job_id in job_ids:
            held.add(job_id)
            job = jobs.get(job_id)
            if job is not None:
                job.hkey = None  # its heap entry is dead from now on (lazy deletion)

    def _hold_new(self, jobs: Iterable[Job]) -> None:
        """`hold` of jobs being admitted in a durable PUSHB (`holding`): off the heap at once."""
        holding = self.holding
        if holding is not None:
            ids = [job.id for job in jobs]
            self.held.update(ids)
            holding.extend(ids)

    def confirm(self, job_ids: Iterable[str]) -> set[str]:
        """The commit of these held jobs is confirmed: make them deliverable. Returns the
        queues that got ready jobs (a parked long-poll there may now be served)."""
        held, jobs = self.held, self.jobs
        ready: dict[str, dict[str, Job]] = {}  # per queue, in one call (a PUSHB's 100 jobs)
        for job_id in job_ids:
            held.discard(job_id)
            job = jobs.get(job_id)
            if job is not None and job.state == WAITING and job.hkey is None:
                run = ready.get(job.queue)
                if run is None:
                    ready[job.queue] = {job_id: job}
                else:
                    run[job_id] = job
        for name, run in ready.items():
            self.queues[name].push_ready_all(run.values())
        return set(ready)

    def forget(self, job_ids: Iterable[str], *, stored: bool) -> list[Mutation]:
        """Drop jobs as if they had never been pushed: their push could not be committed.

        `stored`: their rows were committed after all (the other jobs of a PUSHB one of which
        was rejected), so a `del` for each is returned; otherwise nothing is.
        """
        fx = Effects()
        for job_id in job_ids:
            self.held.discard(job_id)
            job = self.find(job_id)
            if job is not None:
                self.remove(fx, job, emit=stored)
        return fx.mutations

    # -- the only ways a job changes state --------------------------------------------------

    def admit(self, fx: Effects, job: Job, now: int) -> None:
        """Place a new job and emit its full record."""
        q = self.queue(job.queue)
        if job.opts:
            self.admit_all(fx, (job,), q, now)
            return
        # Without options (the common single push) no group, dependency or TTL applies:
        # `admit_all`'s one-job case, written out.
        self.jobs[job.id] = job
        q.ids[job.id] = None
        q.pushed += 1
        (q.history or q.start_history()).pushed(1, now, self.config.max_history_minutes)
        state = DELAYED if job.run_at > now else WAITING
        job.state = state
        job.timeline = ((state, now, None),)
        if self.holding is not None:
            self._hold_new((job,))
        self._enter_all((job,), q, state)
        fx.mutations.append(("put", self.fresh.record(job)))

    def admit_all(self, fx: Effects, jobs: Sequence[Job], q: QueueState, now: int) -> None:
        """Place new jobs of queue `q`, in order, and emit their full records (those of jobs
        without options made with their encoding, `FreshRecords`)."""
        all_jobs = self.jobs
        ids = q.ids
        out = fx.mutations
        q.pushed += len(jobs)
        (q.history or q.start_history()).pushed(len(jobs), now, self.config.max_history_minutes)
        if self.holding is not None:
            self._hold_new(jobs)
        waiting: list[Job] = []
        entry: tuple[str, int, None] | None = None
        timeline: Timeline = ()
        for job in jobs:
            all_jobs[job.id] = job
            ids[job.id] = None
            # Options admission reads (a group, dependencies, a TTL): not `durable` alone,
            # which each job of bunqueue-client's durable add_bulk has.
            opts = job.opts
            read = opts and opts != DURABLE_ONLY
            if read and q.groups is None and opts.get("groupId") is not None:
                q.watch_group(job)
            if read and self.blocked_by_deps(job):
                state = WAITING_CHILDREN
            else:
                state = DELAYED if job.run_at > now else WAITING
            job.state = state
            if entry is None or entry[0] != state:
                # New jobs have no history: those admitted together share their timeline.
                entry = (state, now, None)
                timeline = (entry,)
            job.timeline = timeline
            if state is WAITING:
                # The common case, entered in one pass below: heaps and counts do not depend
                # on the order in which jobs of one state enter.
                waiting.append(job)
            else:
                self._enter_all((job,), q, state)
            if read:
                ttl = opts.get("ttl")
                if ttl:
                    heapq.heappush(self.ttl_heap, (job.created_at + int(ttl), job.id, job.seq))
        if waiting:
            self._enter_all(waiting, q, WAITING)
        # Jobs without options, or durable only (bunqueue-client's durable add_bulk): their
        # records are made with their bytes.
        self.fresh.put_all(jobs, out)

    def admit_waiting(
        self,
        fx: Effects,
        ids: list[str],
        jobs: list[Job],
        q: QueueState,
        now: int,
        puts: list[Mutation],
    ) -> None:
        """`admit_all` of new jobs (ids `ids`) that options do not place (none, or `durable`
        alone) and that are due `now`, each already in the waiting state
        with the timeline `((WAITING, now, None),)`, shared (a payload-only PUSHB's,
        `FreshRecords.payload_jobs`), and `puts` their records' puts: the same tables, heaps,
        counts and records, the tables filled in C."""
        self.jobs.update(zip(ids, jobs, strict=True))
        q.ids.update(dict.fromkeys(ids))
        q.pushed += len(jobs)
        (q.history or q.start_history()).pushed(len(jobs), now, self.config.max_history_minutes)
        if self.holding is not None:
            self._hold_new(jobs)
        # Through the attribute: a head budget wraps it (`_head.ColdHead.install`).
        self._enter_all(jobs, q, WAITING)
        fx.mutations.extend(puts)

    def move(self, fx: Effects, job: Job, event: str, now: int, changes: dict[str, Any]) -> None:
        """Apply a lifecycle event and emit the changed fields.

        Raises:
            IllegalTransition: the lifecycle table forbids `event` in the job's state.
        """
        # `move_run` does the same for many jobs at once; this is its one-job case, kept
        # apart because single commands and every timer and control path come through here.
        state = job.state
        new = next_state(job.id, state, event)
        if new == REMOVED:
            self.remove(fx, job)
            return
        q = self.queues[job.queue]
        if event == "ack":
            q.completed += 1
        one = (job,)
        self._leave_all(one, q, state)
        job.state = new
        job.timeline = extended(job.timeline, (new, now, job.attempts))
        changes["state"] = new
        changes["timeline"] = list(job.timeline)
        fx.mutations.append(("upd", job.key, changes))
        self._enter_all(one, q, new)

    def move_all(
        self, fx: Effects, jobs: Sequence[Job], event: str, now: int, changes: Changes
    ) -> None:
        """`move` each job in turn, with `changes[i]` for `jobs[i]`, or with a copy of
        `changes` for every job when it is one dict; the jobs are distinct.

        Same effect and equal mutations, in the same order, as moving them one by one: the
        table is looked up once per run of jobs in the same state and queue, and each run
        leaves and enters its states in one pass. With one dict of changes, jobs that also
        share their timeline (admitted and moved together) share one `upd` payload.

        Raises:
            IllegalTransition: as `move`, for the first job whose move the table forbids (the
                jobs before it have moved).
        """
        if not jobs:
            return
        first = jobs[0]
        state, queue = first.state, first.queue
        for job in jobs:
            if job.state != state or job.queue != queue:
                break
        else:  # the common case: one run
            self.move_run(fx, jobs, state, queue, event, now, changes)
            return
        count = len(jobs)
        start = 0
        while start < count:
            first = jobs[start]
            state, queue = first.state, first.queue
            end = start + 1
            while end < count and jobs[end].state == state and jobs[end].queue == queue:
                end += 1
            part = changes if isinstance(changes, dict) else changes[start:end]
            self.move_run(fx, jobs[start:end], state, queue, event, now, part)
            start = end

    def move_run(
        self,
        fx: Effects,
        jobs: Sequence[Job],
        state: str,
        queue: str,
        event: str,
        now: int,
        changes: Changes,
    ) -> None:
        """Move jobs that are all in `state` and in `queue` (see `move_all`)."""
        common: dict[str, Any] | None = None
        per_job: Sequence[dict[str, Any]] = ()
        if isinstance(changes, dict):
            common = changes
        else:
            per_job = changes
        if len(jobs) == 1:
            self.move(fx, jobs[0], event, now, dict(common) if common is not None else per_job[0])
            return
        new = next_state(jobs[0].id, state, event)
        if new == REMOVED:
            for job in jobs:
                self.remove(fx, job)
            return
        q = self.queues[queue]
        if event == "ack":
            q.completed += len(jobs)
        self._leave_all(jobs, q, state)
        out = fx.mutations
        entry = (new, now, jobs[0].attempts)
        before: Timeline | None = None
        after: Timeline = ()
        payload: dict[str, Any] = {}
        for i, job in enumerate(jobs):
            job.state = new
            if job.attempts != entry[2]:
                entry = (new, now, job.attempts)
                before = None
            # Jobs admitted and moved together share one timeline: extend it once, and with
            # common changes, emit one payload for all of them (payloads are read-only).
            if job.timeline is not before:
                before = job.timeline
                after = extended(before, entry)
                if common is not None:
                    payload = {**common, "state": new, "timeline": list(after)}
            job.timeline = after
            if common is None:
                payload = per_job[i]
                payload["state"] = new
                payload["timeline"] = list(after)
            out.append(("upd", job.key, payload))
        self._enter_all(jobs, q, new)

    def reorder(self, fx: Effects, job: Job, changes: dict[str, Any]) -> None:
        """Change the fields that place a queued job (priority, lifo, runAt) in its state.

        Leaving and re-entering the state keeps the counts and heap keys right, as `move` does.
        """
        q = self.queue(job.queue)
        self._leave(job, q)
        job.priority = changes.get("priority", job.priority)
        job.lifo = bool(changes.get("lifo", job.lifo))
        job.run_at = changes.get("runAt", job.run_at)
        self.enter(job, q)
        fx.mutations.append(("upd", job.key, changes))

    def requeue_or_delay(
        self, fx: Effects, job: Job, event_now: str, now: int, changes: dict[str, Any]
    ) -> None:
        """Move an active or queued job to waiting or delayed, by its run time."""
        changes["runAt"] = job.run_at
        if job.run_at > now:
            self.move(fx, job, "retry" if job.state == ACTIVE else "delay", now, changes)
        else:
            self.move(fx, job, event_now, now, changes)

    def remove(self, fx: Effects, job: Job, *, emit: bool = True) -> None:
        q = self.queue(job.queue)
        self._leave(job, q)
        self.jobs.pop(job.id, None)
        q.ids.pop(job.id, None)
        q.dlq.pop(job.id, None)
        self.results_order.pop(job.id, None)
        release_unique(self, job, force=True)
        if job.state == COMPLETED:
            remember_completion(self, job.id)
        job.state = REMOVED
        if emit:
            fx.mutations.append(("del", job.key))

    def _leave(self, job: Job, q: QueueState) -> None:
        self._leave_all((job,), q, job.state)

    def enter(self, job: Job, q: QueueState) -> None:
        self._enter_all((job,), q, job.state)

    def _leave_all(self, jobs: Sequence[Job], q: QueueState, state: str) -> None:
        """Undo what being in `state` set up for each job: counts, heap keys, leases, indexes."""
        q.counts[state] -= len(jobs)
        if q.groups is not None:
            q.groups.entered(jobs, state, -1)
        if state == WAITING:
            for job in jobs:
                if job.priority > 0:
                    q.prioritized -= 1
                job.hkey = None
        elif state == ACTIVE:
            self._release_all(jobs)
            if q.limits is not None and q.limits.conc_blocked:
                self.limiter.freed_active(q)  # a held-back pull may get this slot
        elif state == DELAYED:
            for job in jobs:
                job.dkey = None
        elif state == COMPLETED:
            for job in jobs:
                self.completed_order.discard(job.id)
        elif state == FAILED:
            for job in jobs:
                q.dlq.pop(job.id, None)

    def _release_all(self, jobs: Sequence[Job]) -> None:
        """What leaving the active state undoes: the lease (or the stall watch) and the
        connection that held the job."""
        leases, unleased = self.leases, self.unleased
        job_conn, conn_jobs = self.job_conn, self.conn_jobs
        # `untrack_conn`, written out: a pull's jobs share one connection, whose table of
        # jobs is looked up once for a run of them.
        last: str | None = None
        owned: dict[str, int] | None = None
        for job in jobs:
            job_id = job.id
            if job_conn:
                conn = job_conn.pop(job_id, None)
                if conn is not None:
                    if conn is not last:
                        last, owned = conn, conn_jobs.get(conn)
                    if owned is not None:
                        owned.pop(job_id, None)
                        if not owned:
                            del conn_jobs[conn]
                            owned = None
            leases.pop(job_id, None)
            if unleased:
                unleased.pop(job_id, None)

    def _enter_all(self, jobs: Sequence[Job], q: QueueState, state: str) -> None:
        """Set up what being in `state` takes for each job (the jobs' state is `state`).

        A job with options that enters a terminal state gives up its uniqueKey claim.
        """
        q.counts[state] += len(jobs)
        if q.groups is not None:
            q.groups.entered(jobs, state, 1)
        if state == WAITING:
            for job in jobs:
                if job.priority > 0:
                    q.prioritized += 1
            q.push_ready_all(jobs)
        elif state == COMPLETED:
            self.completed_order.extend([job.id for job in jobs])
            for job in jobs:
                if job.opts:
                    release_unique(self, job)
            finished = q.finished or q.start_finished()
            at = jobs[0].completed_at or 0
            finished.note("completed", len(jobs), at, self.config.max_metric_minutes)
            history = q.history or q.start_history()
            history.completed(jobs, at, self.config.max_history_minutes)
        elif state == DELAYED:
            delayed = self.delayed
            for job in jobs:
                key = (job.run_at, job.seq, job.id)
                job.dkey = key
                heapq.heappush(delayed, key)
            self._maybe_compact_delayed()
        elif state == FAILED:
            self.dead_letters.queues.add(q.name)
            for job in jobs:
                q.dlq[job.id] = None
                if job.opts:
                    release_unique(self, job)
            finished = q.finished or q.start_finished()
            at = (jobs[0].dlq or {}).get("enteredAt") or 0
            finished.note("failed", len(jobs), at, self.config.max_metric_minutes)
            history = q.history or q.start_history()
            history.failed(len(jobs), at, self.config.max_history_minutes)

    def _maybe_compact_delayed(self) -> None:
        # Checked only when the heap doubles past its last compacted size, so a delayed push
        # costs O(1) amortised and dead entries never exceed the live ones by more than 2x.
        if len(self.delayed) < self.delayed_watermark:
            return
        self.delayed = [k for k in self.delayed if self._owns_delayed(k)]
        heapq.heapify(self.delayed)
        self.delayed_watermark = max(MIN_COMPACT, 2 * len(self.delayed))

    def _owns_delayed(self, key: tuple[Any, ...]) -> bool:
        job = self.jobs.get(key[-1])
        return job is not None and job.dkey is key

    def revive(self, fx: Effects, job: Job, now: int, *, auto: bool = False) -> None:
        """Give a failed or completed job a fresh run (RetryDlq, RetryCompleted, MoveToWait).

        `auto` marks a DLQ auto-retry, which is counted against the queue's maxAutoRetries.
        """
        job.attempts = 0
        job.stall_count = 0
        job.run_at = now
        job.completed_at = None
        job.dlq = None
        job.failed_reason = None
        job.result, job.has_result = None, False
        changes = {
            "attempts": 0,
            "stallCount": 0,
            "runAt": now,
            "completedAt": None,
            "dlq": None,
            "failedReason": None,
            "returnvalue": None,
            "hasResult": False,
        }
        if auto:
            job.dlq_retries += 1
            changes["dlqRetries"] = job.dlq_retries
        self.move(fx, job, "revive", now, changes)
        claim_unique(self, job)
