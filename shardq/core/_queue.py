"""Per-queue state: the ready and delayed heaps, counts, controls and the DLQ index."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import Any, Final

from ._finished import FinishedLog
from ._groups import GroupTable
from ._history import QueueHistory
from ._job import Job
from ._lifecycle import DELAYED, STATES, WAITING
from ._queue_limits import QueueLimits

__all__ = ["DEFAULT_DLQ_CONFIG", "DEFAULT_STALL_CONFIG", "QueueState"]

# bunqueue defaults (`src/domain/types/stall.ts`, `src/domain/types/dlq.ts`).
DEFAULT_STALL_CONFIG: Final[dict[str, Any]] = {
    "enabled": True,
    "stallInterval": 30_000,
    "maxStalls": 3,
    "gracePeriod": 5_000,
}
DEFAULT_DLQ_CONFIG: Final[dict[str, Any]] = {
    "autoRetry": False,
    "autoRetryInterval": 3_600_000,
    "maxAutoRetries": 3,
    "maxAge": 604_800_000,
    "maxEntries": 10_000,
}


@dataclass(eq=False)
class QueueState:
    """Everything one queue holds besides the job records themselves.

    The ready heap uses lazy deletion: an entry is live only while it is the very tuple the job
    holds in `hkey`, so cancelling or reprioritising a job never searches the heap. The heap is
    rebuilt once dead entries outnumber live ones, which keeps memory bounded.

    Keys that arrive in order (a FIFO queue without priorities or delays, the usual case) go
    on the `lane`, a deque kept sorted, instead of the heap: a pull takes the smaller of the
    two heads, so the order is the heap's alone, and popping the lane's head costs no sift.
    Code outside this class sees one heap, `ready`: reading it first folds the lane into the
    heap, so paging and rebuilding it (`_head`) never miss a lane entry.
    """

    name: str
    jobs: dict[str, Job]
    heap: list[tuple[Any, ...]] = field(default_factory=list)
    lane: deque[tuple[Any, ...]] = field(default_factory=deque)
    ids: dict[str, None] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    prioritized: int = 0
    paused: bool = False
    stall: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_STALL_CONFIG))
    dlq_config: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_DLQ_CONFIG))
    dlq: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # The engine's `held` set (uncommitted durable jobs), shared: they stay off the heap.
    held: set[str] = field(default_factory=set)
    # Rate limit and concurrency cap; None (the usual case) costs a pull one test.
    limits: QueueLimits | None = None
    # Jobs admitted and completed since this shard started (not persisted): the HTTP port
    # turns their differences over time into per-queue rates, so a push or an ACK pays one
    # addition per batch here, not a clock read.
    pushed: int = 0
    completed: int = 0
    # Job groups (`_groups`): None until a grouped job arrives or a group is configured.
    groups: GroupTable | None = None
    # Jobs finished per minute (queue-scoped Metrics), made at the first finished job.
    finished: FinishedLog | None = None
    # The last hour per minute for the dashboard's charts (`_history`), made at first use.
    history: QueueHistory | None = None

    def start_finished(self) -> FinishedLog:
        self.finished = FinishedLog()
        return self.finished

    def start_history(self) -> QueueHistory:
        self.history = QueueHistory()
        return self.history

    def config(self) -> dict[str, Any]:
        """The persisted controls of this queue (mutation `("queue", name, cfg)`). Its groups'
        settings are not among them: each group has its own row (`_group_ops`)."""
        cfg = {"paused": self.paused, "stall": dict(self.stall), "dlq": dict(self.dlq_config)}
        if self.limits is not None:
            cfg["limits"] = self.limits.config()
        return cfg

    def load_config(self, cfg: dict[str, Any]) -> None:
        """Take persisted controls back; `cfg["groups"]` (gid -> settings) is how the store
        hands over the queue's group rows."""
        self.paused = bool(cfg.get("paused", False))
        self.stall.update(cfg.get("stall") or {})
        self.dlq_config.update(cfg.get("dlq") or {})
        if cfg.get("limits"):
            self.limits = QueueLimits.from_config(cfg["limits"])
        if cfg.get("groups"):
            self.groups = GroupTable(self.jobs)
            self.groups.load(cfg["groups"])

    def is_default(self) -> bool:
        """True when the queue holds no jobs and no control differs from the defaults."""
        counts = self.counts
        return (
            not self.ids
            # Under a head budget a queue's cold jobs are counted but not held (`_head`).
            and not counts[WAITING]
            and not counts[DELAYED]
            and not self.paused
            and self.limits is None
            and (self.groups is None or not self.groups.configured())
            and self.stall == DEFAULT_STALL_CONFIG
            and self.dlq_config == DEFAULT_DLQ_CONFIG
        )

    # -- heaps -----------------------------------------------------------------------------

    @property
    def ready(self) -> list[tuple[Any, ...]]:
        """The ready heap with the lane folded into it (for code that scans or rebuilds it)."""
        if self.lane:
            self.heap.extend(self.lane)
            self.lane.clear()
            heapify(self.heap)
        return self.heap

    @ready.setter
    def ready(self, heap: list[tuple[Any, ...]]) -> None:
        self.heap = heap
        self.lane.clear()

    def ready_len(self) -> int:
        """Entries (live or dead) on the heap and the lane, without folding them."""
        return len(self.heap) + len(self.lane)

    def push_ready_all(self, jobs: Iterable[Job]) -> None:
        """Put waiting jobs on the ready heap or lane (each job holds its live entry in
        `hkey`): a key after the lane's last goes on the lane, any other on the heap."""
        heap = self.heap
        lane = self.lane
        held = self.held
        if self.groups is not None:
            jobs = self.groups.divert(jobs, held)
        for job in jobs:
            if held and job.id in held:
                job.hkey = None  # deliverable once its commit is confirmed (`confirm`)
                continue
            if job.lifo:
                key: tuple[Any, ...] = (-job.priority, 0, -job.seq, job.seq, job.id)
            else:
                key = (-job.priority, 1, job.run_at, job.seq, job.id)
            job.hkey = key
            if not lane or lane[-1] < key:
                lane.append(key)
            else:
                heappush(heap, key)
        self._maybe_compact_ready()

    def pop_ready_many(self, count: int) -> list[Job]:
        """Take up to `count` (at least 1) waiting jobs off the ready heap and lane, best
        first (ungrouped jobs only: grouped ones wait on their group's heap)."""
        heap = self.heap
        lane = self.lane
        jobs = self.jobs
        taken: list[Job] = []
        while True:
            if lane:
                key = heappop(heap) if heap and heap[0] < lane[0] else lane.popleft()
            elif heap:
                key = heappop(heap)
            else:
                break
            job = jobs.get(key[-1])
            if job is not None and job.hkey is key and job.state == WAITING:
                job.hkey = None
                taken.append(job)
                if len(taken) >= count:
                    break
        return taken

    def _maybe_compact_ready(self) -> None:
        size = len(self.heap) + len(self.lane)
        if size > 64 and size > 2 * self.live_ready():
            owns = self._owns
            self.heap = [k for k in self.heap if owns(k)]
            heapify(self.heap)
            self.lane = deque(k for k in self.lane if owns(k))  # still sorted

    def watch_group(self, job: Job) -> None:
        """Start the group table at the queue's first grouped job (`job` has options)."""
        if self.groups is None and job.opts.get("groupId") is not None:
            self.groups = GroupTable(self.jobs)

    def live_ready(self) -> int:
        return max(self.counts[WAITING], 1)

    def _owns(self, key: tuple[Any, ...]) -> bool:
        job = self.jobs.get(key[-1])
        return job is not None and job.hkey is key
