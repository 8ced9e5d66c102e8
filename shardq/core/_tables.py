"""The engine's tables, and the bookkeeping over them that changes no job's state.

`EngineTables` holds every in-memory structure of one shard's queues: the jobs, the queues,
the heaps, the leases, the uniqueKey claims, the memory of completed jobs. `EngineState`
(`_state.py`) adds the transitions that change a job's state on top of it.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from shardq.errors import CommandError

from ._config import EngineConfig
from ._effects import Effects
from ._ids import IdFactory
from ._job import CompactJobs, Job, wire_maps
from ._lifecycle import (
    COMPLETED,
    REMOVED,
)
from ._queue import QueueState

__all__ = ["MIN_COMPACT", "EngineTables", "Lease", "delivery_key"]

# Heaps smaller than this are never compacted: rebuilding them would cost more than it saves.
MIN_COMPACT = 64


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


class EngineTables:
    """All in-memory state of one shard's queues, and the bookkeeping that changes no job's
    state: lookups, lease tracking, uniqueKey claims, the completion memory and retention."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        seed: int | None = None,
        compact_pulls: bool = False,
    ) -> None:
        self.config = config or EngineConfig()
        # PULLB answers `CompactJobs` instead of wire maps: for a host that packs replies
        # itself and would rather not build 44-key maps per job (the shard process).
        self.compact_pulls = compact_pulls
        self.rng = random.Random(seed)
        self.ids = IdFactory(self.rng)
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
        # Unleased jobs found late at the last stall check: id -> (delivery, lastHeartbeat).
        self.stall_candidates: dict[str, tuple[int, int]] = {}
        self.conn_jobs: dict[str, dict[str, int]] = {}
        self.job_conn: dict[str, str] = {}
        self.unique: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.dependents: dict[str, set[str]] = {}
        # Completed jobs held, oldest first (evicted past config.max_completed, rows included).
        self.completed_order: OrderedDict[str, None] = OrderedDict()
        self.results_order: OrderedDict[str, None] = OrderedDict()
        # Ids of completed jobs no longer in memory, for dependsOn, oldest first (bounded).
        self.dep_done: dict[str, None] = {}
        self.dep_done_order: deque[str] = deque()
        self.finalized: OrderedDict[str, str] = OrderedDict()
        self.next_stall_check = 0
        # Jobs of durable pushes whose commit is not confirmed yet: never delivered (`hold`).
        self.held: set[str] = set()
        # Cancels of active jobs this turn, for the connections that run them (`_control`):
        # the shard hands them to the front end, which pushes them to those connections.
        self.cancel_notices: list[dict[str, Any]] = []

    def pulled(self, jobs: list[Job]) -> list[dict[str, Any]] | CompactJobs:
        """How PULLB puts its jobs in the reply: wire maps, or `CompactJobs` snapshots."""
        return CompactJobs.of(jobs) if self.compact_pulls else wire_maps(jobs)

    # -- lookups ---------------------------------------------------------------------------

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

    # -- leases ----------------------------------------------------------------------------

    def push_leases(self, expires_at: int, jobs: Sequence[Job]) -> None:
        """Schedule the expiry check of leases granted together (to `jobs`, with the tokens
        they hold now): one heap entry for all of them.

        An entry is (expiresAt, entry number, job id, token), or with tuples of ids and tokens
        for several leases. The entry number keeps the ids out of heap comparisons. Entries go
        stale when a lease ends early; `_expire_leases` skips those.
        """
        self.lease_entries += 1
        if len(jobs) == 1:
            job = jobs[0]
            entry: tuple[Any, ...] = (expires_at, self.lease_entries, job.id, job.token)
        else:
            ids = tuple([job.id for job in jobs])
            tokens = tuple([job.token for job in jobs])
            entry = (expires_at, self.lease_entries, ids, tokens)
        heapq.heappush(self.lease_heap, entry)

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

    # -- dedup, completions and retention ------------------------------------------------

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
        # A bounded FIFO set: the dict answers `in`, the deque remembers the order (cheaper
        # than an OrderedDict; nothing leaves it but its oldest id).
        done = self.dep_done
        if job_id not in done:
            done[job_id] = None
            self.dep_done_order.append(job_id)
            if len(done) > self.config.max_dep_completions:
                del done[self.dep_done_order.popleft()]

    def is_completed(self, job_id: str) -> bool:
        job = self.jobs.get(job_id)
        if job is not None:
            return job.state == COMPLETED
        return job_id in self.dep_done

    def retain_completed(self, fx: Effects, job: Job, pending: int = 0) -> None:
        """Keep memory and disk bounded: evict the oldest completed jobs (from both) and
        the oldest results (from memory; the row keeps its result while the job is held).

        `pending` completed jobs at the end of the order are not counted against the cap yet
        (a batch completes its jobs first and retains them one by one).
        """
        if job.has_result:
            results = self.results_order
            results[job.id] = None
            if len(results) > self.config.max_results:
                jobs = self.jobs
                while len(results) > self.config.max_results:
                    old_id, _ = results.popitem(last=False)
                    old = jobs.get(old_id)
                    if old is not None:
                        old.result, old.has_result = None, False
        self.trim_completed(fx, pending)

    def trim_completed(self, fx: Effects, pending: int = 0) -> None:
        """Evict the oldest completed jobs past the cap (see `retain_completed`)."""
        completed = self.completed_order
        for _ in range(len(completed) - self.config.max_completed - pending):
            self._evict_completed(fx, completed.popitem(last=False)[0])

    def _evict_completed(self, fx: Effects, job_id: str) -> None:
        """Forget a completed job past the cap, in memory and on disk. Runs on every ACK once
        the cache is full, so it does only what a completed job needs undone.

        The row goes too: nothing reads a completed job the engine no longer holds (recovery
        would load it only to evict it again), and keeping it made the database grow with
        every job ever completed.
        """
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        fx.mutations.append(("del", job.key))
        q = self.queues.get(job.queue)
        if q is not None:
            q.ids.pop(job_id, None)
            q.counts[COMPLETED] -= 1
        if self.results_order:
            self.results_order.pop(job_id, None)
        if job.opts:
            self.release_unique(job, force=True)
        self.remember_completion(job_id)
        job.state = REMOVED
