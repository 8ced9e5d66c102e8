"""The job store's bookkeeping that changes no job's state, as functions over its tables.

The job store (`JobStore`, `_state.py`) owns every table of one shard's jobs and does the
transitions. What it and the job operations do besides, without changing a job's state, is
here: scheduling lease expiry, tracking which connection holds a job, the uniqueKey claims,
the memory of completed jobs and their retention. Each function takes the store, typed by the
tables it reads (`Tables`), so this module needs nothing of `_state.py`.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any, Protocol

from ._config import EngineConfig
from ._effects import Effects
from ._job import TIMELINE_MAX, Job, Timeline
from ._lifecycle import COMPLETED, REMOVED
from ._order import CompletedOrder
from ._packed import drop_result
from ._queue import QueueState

__all__ = [
    "MIN_COMPACT",
    "Lease",
    "Tables",
    "arm_timeout",
    "claim_unique",
    "delivery_key",
    "dlq_entry",
    "evict_completed",
    "extended",
    "push_leases",
    "release_unique",
    "remember_completion",
    "retain_completed",
    "track_conn",
    "trim_completed",
    "untrack_conn",
]

# Heaps smaller than this are never compacted: rebuilding them would cost more than it saves.
MIN_COMPACT = 64


def delivery_key(job: Job) -> str:
    """Names one delivery: its lease token, or for a pull without an owner (no token) the job
    id and delivery count, which a token-less ACK of that same delivery still matches."""
    return job.token if job.token is not None else f"{job.id}#{job.delivery}"


class Lease:
    """A fenced claim on active jobs, granted by a pull with an owner.

    One record stands for every job of that pull: a PULLB of 100 makes one, not 100. The
    token a claim is fenced with is each job's own (`Job.token`, set with the lease and
    changed only by a later delivery, which ends the lease first): while a job has a lease,
    its token is the one the holder must show. A renewal changes one job's claim only, so
    it gives that job a record of its own (`renewed`); nothing changes a record once made.
    """

    __slots__ = ("conn", "expires_at", "owner", "renewals", "ttl")

    def __init__(self, owner: str, conn: str | None, now: int, ttl: int, renewals: int = 0) -> None:
        self.owner = owner
        self.conn = conn
        self.ttl = ttl
        self.expires_at = now + ttl
        self.renewals = renewals

    def renewed(self, now: int, ttl: int | None = None) -> Lease:
        """This claim renewed at `now` for `ttl` (None: its own TTL again), as a new record."""
        ttl = self.ttl if ttl is None else ttl
        return Lease(self.owner, self.conn, now, ttl, self.renewals + 1)


class Tables(Protocol):
    """The job store's tables these functions read and change (`JobStore` has them all)."""

    config: EngineConfig
    jobs: dict[str, Job]
    queues: dict[str, QueueState]
    lease_heap: list[tuple[Any, ...]]
    lease_entries: int
    timeouts: list[tuple[int, str, int]]
    conn_jobs: dict[str, dict[str, int]]
    job_conn: dict[str, str]
    unique: OrderedDict[tuple[str, str], str]
    completed_order: CompletedOrder
    results_order: OrderedDict[str, None]
    dep_done: dict[str, None]
    dep_done_order: deque[str]


# -- leases ----------------------------------------------------------------------------


def push_leases(
    store: Tables, expires_at: int, jobs: Sequence[Job], tokens: Sequence[str] | None = None
) -> None:
    """Schedule the expiry check of leases granted together (to `jobs`, with the tokens
    they hold now, which `tokens` may give in their order): one heap entry for all of them.

    An entry is (expiresAt, entry number, job id, token), or with tuples of ids and tokens
    for several leases. The entry number keeps the ids out of heap comparisons. Entries go
    stale when a lease ends early; the timers' lease sweep skips those.
    """
    store.lease_entries += 1
    if len(jobs) == 1:
        job = jobs[0]
        entry: tuple[Any, ...] = (expires_at, store.lease_entries, job.id, job.token)
    else:
        ids = tuple([job.id for job in jobs])
        held = tuple([job.token for job in jobs]) if tokens is None else tuple(tokens)
        entry = (expires_at, store.lease_entries, ids, held)
    heapq.heappush(store.lease_heap, entry)


def arm_timeout(store: Tables, job: Job, now: int) -> None:
    """Schedule the timeout of a job just delivered, if its options set one."""
    timeout = job.opts.get("timeout")
    if timeout:
        heapq.heappush(store.timeouts, (now + int(timeout), job.id, job.delivery))


def lease_all(
    store: Tables,
    leases: dict[str, Lease],
    jobs: Sequence[Job],
    tokens: Sequence[str],
    owner: str,
    conn: str | None,
    ttl: int,
    track: object,
    now: int,
) -> None:
    """Deliver each of `jobs` just moved to active (its start, heartbeat and delivery count),
    lease it to `owner` with its token, track it under the connection `track` (as
    `track_conn`) and arm its timeout: a pull's `_consume._hold`, one pass, and one `Lease`
    record for all of them."""
    owned = store.conn_jobs.setdefault(track, {}) if isinstance(track, str) else None
    job_conn = store.job_conn
    lease = Lease(owner, conn, now, ttl)
    for job, token in zip(jobs, tokens, strict=True):
        job.started_at = job.last_heartbeat = now
        job.delivery = delivery = job.delivery + 1
        job.token, job.leased = token, True
        job_id = job.id
        leases[job_id] = lease
        if owned is not None:
            owned[job_id] = delivery
            job_conn[job_id] = track  # type: ignore[assignment]  # a str: `owned` says so
        if job.opts:
            arm_timeout(store, job, now)


def track_conn(store: Tables, conn: object, job: Job) -> None:
    if isinstance(conn, str):
        store.conn_jobs.setdefault(conn, {})[job.id] = job.delivery
        store.job_conn[job.id] = conn


def untrack_conn(store: Tables, job: Job) -> None:
    conn = store.job_conn.pop(job.id, None)
    if conn is not None:
        owned = store.conn_jobs.get(conn)
        if owned is not None:
            owned.pop(job.id, None)
            if not owned:
                del store.conn_jobs[conn]


# -- dedup, completions and retention ------------------------------------------------


def release_unique(store: Tables, job: Job, *, force: bool = False) -> None:
    key = job.unique_key
    if key is None:
        return
    ukey = (job.queue, key)
    if store.unique.get(ukey) != job.id:
        return
    # A key with a TTL outlives its job's completion; without one it lives as long as the job.
    if force or job.dedup_until is None:
        del store.unique[ukey]


def claim_unique(store: Tables, job: Job) -> None:
    key = job.unique_key
    if key is None:
        return
    unique = store.unique
    unique[(job.queue, key)] = job.id
    unique.move_to_end((job.queue, key))
    while len(unique) > store.config.max_dedup_keys:
        unique.popitem(last=False)


def remember_completion(store: Tables, job_id: str) -> None:
    # A bounded FIFO set: the dict answers `in`, the deque remembers the order (cheaper
    # than an OrderedDict; nothing leaves it but its oldest id).
    done = store.dep_done
    if job_id not in done:
        done[job_id] = None
        store.dep_done_order.append(job_id)
        if len(done) > store.config.max_dep_completions:
            del done[store.dep_done_order.popleft()]


def retain_completed(store: Tables, fx: Effects, job: Job, pending: int = 0) -> None:
    """Keep memory and disk bounded: evict the oldest completed jobs (from both) and
    the oldest results (from memory; the row keeps its result while the job is held).

    `pending` completed jobs at the end of the order are not counted against the cap yet
    (a batch completes its jobs first and retains them one by one).
    """
    if job.has_result:
        results = store.results_order
        results[job.id] = None
        if len(results) > store.config.max_results:
            jobs = store.jobs
            while len(results) > store.config.max_results:
                old_id, _ = results.popitem(last=False)
                old = jobs.get(old_id)
                if old is not None:
                    drop_result(old)
    trim_completed(store, fx, pending)


def trim_completed(store: Tables, fx: Effects, pending: int = 0) -> None:
    """Evict the oldest completed jobs past the cap (see `retain_completed`)."""
    completed = store.completed_order
    for _ in range(len(completed) - store.config.max_completed - pending):
        evict_completed(store, fx, completed.pop_oldest())


def evict_completed(store: Tables, fx: Effects, job_id: str) -> None:
    """Forget a completed job past the cap, in memory and on disk. Runs on every ACK once
    the cache is full, so it does only what a completed job needs undone.

    The row goes too: nothing reads a completed job the engine no longer holds (recovery
    would load it only to evict it again), and keeping it made the database grow with
    every job ever completed.
    """
    job = store.jobs.pop(job_id, None)
    if job is None:
        return
    fx.mutations.append(("del", job.key))
    q = store.queues.get(job.queue)
    if q is not None:
        q.ids.pop(job_id, None)
        q.counts[COMPLETED] -= 1
    if store.results_order:
        store.results_order.pop(job_id, None)
    if job.opts:
        release_unique(store, job, force=True)
    remember_completion(store, job_id)
    job.state = REMOVED


# -- the records a transition writes ---------------------------------------------------


def extended(timeline: Timeline, entry: tuple[str, int, int | None]) -> Timeline:
    """`timeline` with `entry` appended; a timeline keeps its last TIMELINE_MAX entries."""
    if len(timeline) < TIMELINE_MAX:
        return (*timeline, entry)
    return (*timeline[1:], entry)


def dlq_entry(job: Job, reason: str, now: int, max_age: Any, seq: int) -> dict[str, Any]:
    """The DLQ record of a job dead-lettered at `now` (`JobStore.dead`); `seq` is its entry
    order, so recovery rebuilds the DLQ in the order jobs entered it."""
    started = job.started_at if job.started_at is not None else now
    attempt = {
        "attempt": job.attempts,
        "startedAt": job.started_at,
        "failedAt": now,
        "reason": reason,
        "error": job.failed_reason,
        "duration": now - started,
    }
    return {
        "enteredAt": now,
        "reason": reason,
        "error": job.failed_reason,
        "attempts": [attempt],
        "retryCount": job.dlq_retries,
        "lastRetryAt": None,
        "nextRetryAt": None,
        "expiresAt": now + int(max_age) if max_age else None,
        "entrySeq": seq,
    }
