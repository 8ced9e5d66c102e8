"""The engine's state and the primitives every operation uses to change it.

Each operation module (produce, consume, control, query, timers) is a mixin over `EngineState`.
Every change to a job goes through `move`, `admit` or `remove`, which keep the counts, heaps,
indexes and the mutation stream consistent in one place.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from typing import Any

from shardq.errors import CommandError

from ._config import EngineConfig
from ._ids import IdFactory
from ._job import Job
from ._lifecycle import (
    ACTIVE,
    COMPLETED,
    DELAYED,
    FAILED,
    REMOVED,
    TERMINAL_STATES,
    WAITING,
    WAITING_CHILDREN,
    next_state,
)
from ._mutations import Mutation
from ._options import as_int
from ._queue import QueueState

__all__ = ["EngineState", "Lease", "delivery_key"]

# Heaps smaller than this are never compacted: rebuilding them would cost more than it saves.
_MIN_COMPACT = 64


def delivery_key(job: Job) -> str:
    """Names one delivery: its lease token, or for a pull without an owner (no token) the job
    id and delivery count, which a token-less ACK of that same delivery still matches."""
    return job.token if job.token is not None else f"{job.id}#{job.delivery}"


class Lease:
    """A fenced claim on an active job, granted by a pull with an owner."""

    __slots__ = ("conn", "expires_at", "owner", "renewals", "token", "ttl")

    def __init__(self, token: str, owner: str, conn: str | None, now: int, ttl: int) -> None:
        self.token = token
        self.owner = owner
        self.conn = conn
        self.ttl = ttl
        self.expires_at = now + ttl
        self.renewals = 0


class EngineState:
    """All in-memory state of one shard's queues."""

    def __init__(self, config: EngineConfig | None = None, *, seed: int | None = None) -> None:
        self.config = config or EngineConfig()
        self.rng = random.Random(seed)
        self.ids = IdFactory(self.rng)
        self.seq = 0
        self.jobs: dict[str, Job] = {}
        self.queues: dict[str, QueueState] = {}
        self.delayed: list[tuple[Any, ...]] = []
        self.delayed_watermark = _MIN_COMPACT
        self.leases: dict[str, Lease] = {}
        self.lease_heap: list[tuple[int, str, str]] = []
        self.timeouts: list[tuple[int, str, int]] = []
        self.ttl_heap: list[tuple[int, str, int]] = []
        self.unleased: dict[str, None] = {}
        # Unleased jobs found late at the last stall check: id -> (delivery, lastHeartbeat).
        self.stall_candidates: dict[str, tuple[int, int]] = {}
        self.conn_jobs: dict[str, dict[str, int]] = {}
        self.job_conn: dict[str, str] = {}
        self.unique: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.dependents: dict[str, set[str]] = {}
        self.completed_order: OrderedDict[str, None] = OrderedDict()
        self.results_order: OrderedDict[str, None] = OrderedDict()
        self.dep_done: OrderedDict[str, None] = OrderedDict()
        self.finalized: OrderedDict[str, str] = OrderedDict()
        self.next_stall_check = 0
        self.next_dlq_check = 0
        self.out: list[Mutation] = []
        self.events: list[tuple[str, str, str]] = []

    # -- lookups ---------------------------------------------------------------------------

    def queue(self, name: str) -> QueueState:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueState(name, self.jobs)
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

    # -- the only ways a job changes state --------------------------------------------------

    def admit(self, job: Job, now: int) -> None:
        """Place a new job and emit its full record."""
        self.jobs[job.id] = job
        q = self.queue(job.queue)
        q.ids[job.id] = None
        opts = job.opts
        if opts and self._blocked_by_deps(job):
            job.state = WAITING_CHILDREN
        else:
            job.state = DELAYED if job.run_at > now else WAITING
        job.note(job.state, now)
        self._enter(job, q)
        ttl = opts.get("ttl") if opts else None
        if ttl:
            heapq.heappush(self.ttl_heap, (job.created_at + int(ttl), job.id, job.seq))
        self.out.append(("put", job.to_record()))

    def move(self, job: Job, event: str, now: int, changes: dict[str, Any]) -> None:
        """Apply a lifecycle event and emit the changed fields.

        Raises:
            IllegalTransition: the lifecycle table forbids `event` in the job's state.
        """
        new = next_state(job.id, job.state, event)
        if new == REMOVED:
            self.remove(job)
            return
        q = self.queues[job.queue]
        self._leave(job, q)
        job.state = new
        job.note(new, now, job.attempts)
        self._enter(job, q)
        changes["state"] = new
        changes["timeline"] = list(job.timeline)
        self.out.append(("upd", job.key, changes))

    def reorder(self, job: Job, changes: dict[str, Any]) -> None:
        """Change the fields that place a queued job (priority, lifo, runAt) in its state.

        Leaving and re-entering the state keeps the counts and heap keys right, as `move` does.
        """
        q = self.queue(job.queue)
        self._leave(job, q)
        job.priority = changes.get("priority", job.priority)
        job.lifo = bool(changes.get("lifo", job.lifo))
        job.run_at = changes.get("runAt", job.run_at)
        self._enter(job, q)
        self.out.append(("upd", job.key, changes))

    def requeue_or_delay(self, job: Job, event_now: str, now: int, changes: dict[str, Any]) -> None:
        """Move an active or queued job to waiting or delayed, by its run time."""
        changes["runAt"] = job.run_at
        if job.run_at > now:
            self.move(job, "retry" if job.state == ACTIVE else "delay", now, changes)
        else:
            self.move(job, event_now, now, changes)

    def remove(self, job: Job, *, emit: bool = True) -> None:
        q = self.queue(job.queue)
        self._leave(job, q)
        self.jobs.pop(job.id, None)
        q.ids.pop(job.id, None)
        q.dlq.pop(job.id, None)
        self.completed_order.pop(job.id, None)
        self.results_order.pop(job.id, None)
        self.release_unique(job, force=True)
        if job.state == COMPLETED:
            self.remember_completion(job.id)
        job.state = REMOVED
        if emit:
            self.out.append(("del", job.key))

    def _leave(self, job: Job, q: QueueState) -> None:
        state = job.state
        q.counts[state] -= 1
        if state == WAITING:
            if job.priority > 0:
                q.prioritized -= 1
            job.hkey = None
        elif state == DELAYED:
            job.dkey = None
        elif state == ACTIVE:
            self.untrack_conn(job)
            self.drop_lease(job)
        elif state == FAILED:
            q.dlq.pop(job.id, None)
        elif state == COMPLETED:
            self.completed_order.pop(job.id, None)

    def _enter(self, job: Job, q: QueueState) -> None:
        state = job.state
        q.counts[state] += 1
        if state == WAITING:
            if job.priority > 0:
                q.prioritized += 1
            q.push_ready(job)
        elif state == DELAYED:
            key = (job.run_at, job.seq, job.id)
            job.dkey = key
            heapq.heappush(self.delayed, key)
            self._maybe_compact_delayed()
        elif state == FAILED:
            q.dlq[job.id] = None
        elif state == COMPLETED:
            self.completed_order[job.id] = None
        if job.opts and state in TERMINAL_STATES:
            self.release_unique(job)

    def _maybe_compact_delayed(self) -> None:
        # Checked only when the heap doubles past its last compacted size, so a delayed push
        # costs O(1) amortised and dead entries never exceed the live ones by more than 2x.
        if len(self.delayed) < self.delayed_watermark:
            return
        self.delayed = [k for k in self.delayed if self._owns_delayed(k)]
        heapq.heapify(self.delayed)
        self.delayed_watermark = max(_MIN_COMPACT, 2 * len(self.delayed))

    def _owns_delayed(self, key: tuple[Any, ...]) -> bool:
        job = self.jobs.get(key[-1])
        return job is not None and job.dkey is key

    # -- leases ----------------------------------------------------------------------------

    def drop_lease(self, job: Job) -> None:
        self.leases.pop(job.id, None)
        self.unleased.pop(job.id, None)

    def track_conn(self, conn: object, job: Job) -> None:
        if isinstance(conn, str):
            self.conn_jobs.setdefault(conn, {})[job.id] = job.delivery
            self.job_conn[job.id] = conn

    def untrack_conn(self, job: Job) -> None:
        conn = self.job_conn.pop(job.id, None)
        if conn is not None:
            owned = self.conn_jobs.get(conn)
            if owned is not None:
                owned.pop(job.id, None)
                if not owned:
                    del self.conn_jobs[conn]

    def finalize(self, job: Job) -> None:
        """Remember a retired delivery so its late ACK gets "already-finalized"."""
        self.finalized[delivery_key(job)] = job.id
        if len(self.finalized) > self.config.max_finalized:
            self.finalized.popitem(last=False)

    # -- dedup, dependencies and retention ------------------------------------------------

    def release_unique(self, job: Job, *, force: bool = False) -> None:
        key = job.unique_key
        if key is None:
            return
        ukey = (job.queue, key)
        if self.unique.get(ukey) != job.id:
            return
        # A key with a TTL outlives its job's completion; without one it lives as long as the job.
        if force or job.dedup_until is None:
            del self.unique[ukey]

    def claim_unique(self, job: Job) -> None:
        key = job.unique_key
        if key is None:
            return
        self.unique[(job.queue, key)] = job.id
        self.unique.move_to_end((job.queue, key))
        while len(self.unique) > self.config.max_dedup_keys:
            self.unique.popitem(last=False)

    def remember_completion(self, job_id: str) -> None:
        self.dep_done[job_id] = None
        if len(self.dep_done) > self.config.max_dep_completions:
            self.dep_done.popitem(last=False)

    def is_completed(self, job_id: str) -> bool:
        job = self.jobs.get(job_id)
        if job is not None:
            return job.state == COMPLETED
        return job_id in self.dep_done

    def _blocked_by_deps(self, job: Job) -> bool:
        deps = job.opts.get("dependsOn")
        if not deps:
            return False
        pending = [d for d in deps if not self.is_completed(d)]
        for dep in pending:
            self.dependents.setdefault(dep, set()).add(job.id)
        return bool(pending)

    def release_dependents(self, job_id: str, now: int) -> None:
        if not self.dependents:
            return
        for child_id in sorted(self.dependents.pop(job_id, ())):
            child = self.jobs.get(child_id)
            if child is None or child.state != WAITING_CHILDREN:
                continue
            if all(self.is_completed(d) for d in child.opts.get("dependsOn") or ()):
                self.requeue_or_delay(child, "release", now, {})

    def retain_completed(self, job: Job) -> None:
        """Keep memory bounded: evict the oldest completed jobs and results (not from disk)."""
        if job.has_result:
            self.results_order[job.id] = None
            while len(self.results_order) > self.config.max_results:
                old_id, _ = self.results_order.popitem(last=False)
                old = self.jobs.get(old_id)
                if old is not None:
                    old.result, old.has_result = None, False
        while len(self.completed_order) > self.config.max_completed:
            old_id, _ = self.completed_order.popitem(last=False)
            self._evict_completed(old_id)

    def _evict_completed(self, job_id: str) -> None:
        """Forget a completed job in memory only (its row stays on disk). Runs on every ACK
        once the cache is full, so it does only what a completed job needs undone."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        q = self.queues.get(job.queue)
        if q is not None:
            q.ids.pop(job_id, None)
            q.counts[COMPLETED] -= 1
        self.results_order.pop(job_id, None)
        if job.opts:
            self.release_unique(job, force=True)
        self.remember_completion(job_id)
        job.state = REMOVED

    # -- dead letters ----------------------------------------------------------------------

    def dead(
        self, job: Job, reason: str, now: int, changes: dict[str, Any], remove: object = None
    ) -> None:
        """Send a job to its queue's DLQ (or drop it when removeOnFail says so)."""
        if remove is None:
            remove = job.opts.get("removeOnFail")
        if remove:
            self.remove(job)
            return
        q = self.queue(job.queue)
        max_age = q.dlq_config.get("maxAge")
        started = job.started_at if job.started_at is not None else now
        attempt = {
            "attempt": job.attempts,
            "startedAt": job.started_at,
            "failedAt": now,
            "reason": reason,
            "error": job.failed_reason,
            "duration": now - started,
        }
        job.dlq = {
            "enteredAt": now,
            "reason": reason,
            "error": job.failed_reason,
            "attempts": [attempt],
            "retryCount": job.dlq_retries,
            "lastRetryAt": None,
            "nextRetryAt": None,
            "expiresAt": now + int(max_age) if max_age else None,
            # Entry order, so recovery rebuilds the DLQ in the order jobs entered it.
            "entrySeq": self.next_seq(),
        }
        changes["dlq"] = job.dlq
        self.move(job, "dead", now, changes)
        self.events.append(("dead", job.queue, job.id))
        self._cap_dlq(q)

    def _cap_dlq(self, q: QueueState) -> None:
        limit = as_int(q.dlq_config.get("maxEntries"), 10_000)
        while len(q.dlq) > max(limit, 0):
            oldest = next(iter(q.dlq))
            self.remove(self.jobs[oldest])

    def revive(self, job: Job, now: int, *, auto: bool = False) -> None:
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
        self.move(job, "revive", now, changes)
        self.claim_unique(job)
