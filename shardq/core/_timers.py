"""What time does (the `timers` component): promotions, lease expiry, timeouts, TTLs, stalls,
DLQ upkeep, and recovery."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from ._consume import Consumer
from ._effects import Effects
from ._job import Job, backoff_delay
from ._lifecycle import ACTIVE, COMPLETED, DELAYED, TERMINAL_STATES, WAITING, WAITING_CHILDREN
from ._mutations import Record
from ._options import as_int
from ._order import CompletedOrder
from ._packed import from_record, pack_job, pack_with
from ._parts import DeadLetterPart
from ._state import JobStore
from ._tables import claim_unique, evict_completed, push_leases, retain_completed

__all__ = ["Timers"]


class Timers:
    """What time does to the jobs (the engine's `timers` component): promotions, lease
    expiry, timeouts, TTLs, stalls, the DLQ upkeep in its place and completed retention; and
    recovery, which loads stored jobs into the store. Owns the stall watch's own state."""

    def __init__(self, store: JobStore, consume: Consumer, dead_letters: DeadLetterPart) -> None:
        self.store = store
        self.consume = consume
        self.dead_letters = dead_letters
        self.jobs = store.jobs
        self.queues = store.queues
        self.config = store.config
        self.rng = store.rng
        self.leases = store.leases
        self.unleased = store.unleased
        self.timeouts = store.timeouts
        self.ttl_heap = store.ttl_heap
        self.lease_heap = store.lease_heap
        # Unleased jobs found late at the last stall check: id -> (delivery, lastHeartbeat).
        self.stall_candidates: dict[str, tuple[int, int]] = {}
        self.next_stall_check = 0

    def tick(self, fx: Effects, now: int) -> None:
        """Fire every deadline of the jobs that is due at `now`; the engine runs its other
        components' after these."""
        self.consume.promote_due(fx, now)
        self._expire_leases(fx, now)
        self._expire_timeouts(fx, now)
        self._expire_ttls(fx, now)
        if now >= self.next_stall_check:
            self._check_stalls(fx, now)
            self.next_stall_check = now + self.config.stall_check_ms
        self.dead_letters.tick(fx, now)
        if self.config.completed_retention_ms and self.store.completed_order:
            self._expire_completed(fx, now)

    def next_deadline(self) -> int | None:
        """When `tick` next has work to do, or None when nothing is scheduled."""
        # Runs twice per shard turn: no list of candidates, and no call for what is empty.
        deadline: int | None = None
        for heap in (self.store.delayed, self.lease_heap, self.timeouts, self.ttl_heap):
            if heap and (deadline is None or heap[0][0] < deadline):
                deadline = heap[0][0]
        if self.unleased and (deadline is None or self.next_stall_check < deadline):
            deadline = self.next_stall_check
        if self.dead_letters.queues:  # else no DLQ holds an entry (`DeadLetterPart.any`)
            dlq = self.dead_letters.deadline()
            if dlq is not None and (deadline is None or dlq < deadline):
                deadline = dlq
        if self.config.completed_retention_ms and self.store.completed_order:
            expiry = self._completed_expiry()
            if deadline is None or expiry < deadline:
                deadline = expiry
        return deadline

    def _completed_expiry(self) -> int:
        """When the oldest completed job outlives completed_retention_ms."""
        oldest = self.jobs.get(self.store.completed_order.oldest())
        finished = oldest.completed_at if oldest is not None else None
        return (finished or 0) + self.config.completed_retention_ms

    def _expire_completed(self, fx: Effects, now: int) -> None:
        # completed_order is in completion order, so the expired ones are at its front.
        completed = self.store.completed_order
        while completed and self._completed_expiry() <= now:
            evict_completed(self.store, fx, completed.pop_oldest())

    # -- deadlines -------------------------------------------------------------------------

    def _expire_leases(self, fx: Effects, now: int) -> None:
        heap = self.lease_heap
        due: list[tuple[int, str, str]] = []
        while heap and heap[0][0] <= now:
            expires_at, _, job_ids, tokens = heapq.heappop(heap)
            if type(job_ids) is str:
                due.append((expires_at, job_ids, tokens))
            else:
                due.extend([(expires_at, i, t) for i, t in zip(job_ids, tokens, strict=True)])
        # By expiry time, then job id: the order of one heap entry per lease.
        due.sort()
        for _, job_id, token in due:
            lease = self.leases.get(job_id)
            if lease is None or self.jobs[job_id].token != token:  # the lease's token (`Lease`)
                continue
            if lease.expires_at > now:
                push_leases(self.store, lease.expires_at, [self.jobs[job_id]])
                continue
            self.stall(fx, self.jobs[job_id], now, backoff=False)

    def _expire_timeouts(self, fx: Effects, now: int) -> None:
        heap = self.timeouts
        while heap and heap[0][0] <= now:
            _, job_id, delivery = heapq.heappop(heap)
            job = self.jobs.get(job_id)
            if job is None or job.state != ACTIVE or job.delivery != delivery:
                continue
            timeout = job.opts.get("timeout")
            job.failed_reason = f"Job timed out after {timeout}ms"
            self.store.finalize(job)
            fx.events.append(("timeout", job.queue, job.id))
            self.consume.charge(fx, job, now, "timeout")

    def _expire_ttls(self, fx: Effects, now: int) -> None:
        heap = self.ttl_heap
        while heap and heap[0][0] <= now:
            _, job_id, seq = heapq.heappop(heap)
            job = self.jobs.get(job_id)
            if job is not None and job.seq == seq and job.state in (WAITING, DELAYED):
                fx.events.append(("expired", job.queue, job.id))
                self.store.move(fx, job, "expire", now, {})

    def _check_stalls(self, fx: Effects, now: int) -> None:
        """Two-phase, as bunqueue's `checkStalledJobs`: a late job first becomes a candidate
        and is reclaimed at the next check only if nothing was heard from it in between."""
        candidates, self.stall_candidates = self.stall_candidates, {}
        for job_id in list(self.unleased):
            job = self.jobs[job_id]
            if not self._is_late(job, now):
                continue
            if candidates.get(job_id) == (job.delivery, job.last_heartbeat):
                self.stall(fx, job, now, backoff=True)
            else:
                self.stall_candidates[job_id] = (job.delivery, job.last_heartbeat)

    def _is_late(self, job: Job, now: int) -> bool:
        cfg = self.store.queue(job.queue).stall
        if not cfg.get("enabled", True) or job.started_at is None:
            return False
        limit = as_int(job.opts.get("stallTimeout"), as_int(cfg.get("stallInterval"), 30_000))
        grace = as_int(cfg.get("gracePeriod"), 0)
        return now - job.started_at >= grace and now - job.last_heartbeat > limit

    def stall(self, fx: Effects, job: Job, now: int, *, backoff: bool) -> None:
        """Reclaim an active job nobody finished: attempts + 1, stallCount + 1, or the DLQ.

        A lapsed lease requeues at once (bunqueue `requeueExpiredJob`); a stall found by the
        heartbeat check, or at startup, waits out the backoff first.
        """
        job.stall_count += 1
        job.attempts += 1
        job.last_heartbeat = now
        changes: dict[str, Any] = {
            "attempts": job.attempts,
            "stallCount": job.stall_count,
            "lastHeartbeat": now,
        }
        max_stalls = as_int(self.store.queue(job.queue).stall.get("maxStalls"), 3)
        fx.events.append(("stalled", job.queue, job.id))
        if job.attempts >= job.max_attempts or job.stall_count >= max_stalls:
            # The sweep retired this delivery: its late ACK is answered "already-finalized".
            self.store.finalize(job)
        if job.attempts >= job.max_attempts:
            job.failed_reason = f"Job reached max attempts ({job.max_attempts})"
            changes["failedReason"] = job.failed_reason
            self.store.dead(fx, job, "max_attempts_exceeded", now, changes)
        elif job.stall_count >= max_stalls:
            job.failed_reason = f"Job stalled {job.stall_count} times"
            changes["failedReason"] = job.failed_reason
            self.store.dead(fx, job, "stalled", now, changes)
        else:
            if backoff:
                job.run_at = now + backoff_delay(job, self.rng)
            self.store.requeue_or_delay(fx, job, "requeue", now, changes)

    # -- recovery and replay ---------------------------------------------------------------

    def restore(
        self,
        fx: Effects,
        records: Iterable[Record],
        queues: Mapping[str, Mapping[str, Any]],
        now: int,
        *,
        recover: bool = True,
    ) -> None:
        """Load persisted records into the (empty) store (`Engine.restore`).

        With `recover`, jobs that were active when the process died come back with attempts
        + 1 (or go to the DLQ at the limit), as bunqueue's startup recovery does
        (docs/protocol.md §4.12). Without it, the records are loaded exactly as they are: the
        replay of a mutation stream.
        """
        for name, cfg in queues.items():
            self.store.queue(name).load_config(dict(cfg))
        active: list[Job] = []
        times: dict[int, int] = {}
        for rec in records:
            job = self._load(*from_record(rec), now, times)
            if job.state == ACTIVE:
                active.append(job)
        for job in self.jobs.values():
            if job.state == WAITING_CHILDREN:
                self.store.blocked_by_deps(job)
        self._restore_orders()
        for job in [self.jobs[i] for i in self.store.completed_order]:
            retain_completed(self.store, fx, job)
        for job in active:
            if recover:
                self.stall(fx, job, now, backoff=True)
            else:
                self.unleased[job.id] = None

    # -- what the writer could not store ---------------------------------------------------

    def reload(self, job_id: str, record: Record | None, now: int) -> None:
        """Make job `job_id` what is stored (`record`, None: nothing is): a change to it could
        not be committed, so the copy in memory holds values the disk never will.
        Whatever this emits is dropped: it restores what the disk holds."""
        fx = Effects()
        job = self.store.find(job_id)
        if job is not None:
            self.store.remove(fx, job, emit=False)
        if record is not None:
            job = self._load(Job.from_record(record), None, int(now), {})
            if job.state == ACTIVE:
                self.unleased[job.id] = None  # its lease went with the old copy: stall-watched

    def _restore_orders(self) -> None:
        """Records arrive in admission order; the DLQ and completed lists are by entry time."""
        for q in self.queues.values():
            dlq = sorted(q.dlq, key=lambda i: _entry_seq(self.jobs[i]))
            q.dlq = OrderedDict.fromkeys(dlq)
        jobs = self.jobs
        done = sorted(self.store.completed_order, key=lambda i: (_finished(jobs[i]), jobs[i].seq))
        self.store.completed_order = CompletedOrder(done)

    def _load(self, job: Job, blob: bytes | None, now: int, times: dict[int, int]) -> Job:
        self.store.seq = max(self.store.seq, job.seq, _entry_seq(job))
        self.jobs[job.id] = job
        q = self.store.queue(job.queue)
        q.ids[job.id] = None
        if job.opts:
            q.watch_group(job)
        self.store.enter(job, q)
        if job.state not in TERMINAL_STATES or (job.dedup_until or 0) > now:
            claim_unique(self.store, job)
        ttl = job.opts.get("ttl")
        if ttl:
            heapq.heappush(self.ttl_heap, (job.created_at + int(ttl), job.id, job.seq))
        if job.state == COMPLETED:
            # Packed as it is loaded, not at the release after the load: its payload, result
            # and timeline go now, so the next records' objects reuse their memory, and what
            # stays (the job, its record, its id) fills the allocator's arenas densely. Packed
            # after the load, the 50,000 survivors were spread over every arena the load's
            # transients had filled: a shard that loaded them sat at 122 MB, not ~70.
            _share_times(job, times)
            if blob is not None:
                pack_with(job, blob)  # made from its record (`_packed.from_record`)
            else:
                pack_job(job)
        return job


# The most distinct times `_share_times` remembers; past it, it starts again.
_SHARED_TIMES = 4096


def _share_times(job: Job, times: dict[int, int]) -> None:
    """Give a loaded completed job the int object an earlier one had for the same creation
    and completion time. Each decoded record has its own (32 bytes each: epoch milliseconds
    are past the ints CPython shares), where jobs pushed in one batch, or acknowledged in one,
    shared one object when they were live; the jobs load in admission order, so equal times
    mostly come together, and a small table finds them."""
    if len(times) > _SHARED_TIMES:
        times.clear()
    created, completed = job.created_at, job.completed_at
    if type(created) is int:
        job.created_at = times.setdefault(created, created)
    if type(completed) is int:
        job.completed_at = times.setdefault(completed, completed)


def _entry_seq(job: Job) -> int:
    dlq = job.dlq
    return as_int(dlq.get("entrySeq"), job.seq) if dlq else job.seq


def _finished(job: Job) -> int:
    return job.completed_at or 0
