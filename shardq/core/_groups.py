"""Job groups of one queue: per-group ready heaps, counts, limits and the round-robin ring.

A queue gets a `GroupTable` when its first grouped job arrives or a group is configured; a
queue without one pays a single `is None` test per pull and per batch of state changes.

Delivery order (docs/protocol.md §17): ungrouped jobs first (the queue's own heap), then one
job per group in turn, starting after the group served last. Inside a group, lower priority
first, then earlier run time, then push order. A group that is paused, at its concurrency cap,
out of rate-limit room or under a manual rate limit (`RateLimitGroup`) is skipped: a paused
group leaves the ring until it is resumed; any other stays in the ring, and the pull that
skipped it is "held back" so the engine wakes parked pulls when the group gets room again
(`wakes_at`, `room`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from heapq import heapify, heappop, heappush
from typing import Any

from ._job import Job
from ._lifecycle import ACTIVE, DELAYED, WAITING
from ._options import is_number
from ._queue_limits import QueueLimits

__all__ = ["Group", "GroupTable", "group_of", "group_size_error"]


def group_of(job: Job) -> str | None:
    """The job's group id, or None for an ungrouped job."""
    opts = job.opts
    return opts.get("groupId") if opts else None


class Group:
    """One group: its ready heap, how many of its jobs wait, are delayed or active, and its
    settings (None: no limit)."""

    __slots__ = ("active", "delayed", "in_ring", "limits", "paused", "ready", "until", "waiting")

    def __init__(self) -> None:
        self.ready: list[tuple[Any, ...]] = []
        self.waiting = 0
        self.delayed = 0
        self.active = 0
        self.in_ring = False
        self.paused = False
        # Rate limit and concurrency cap, with `QueueLimits`' sliding window.
        self.limits: QueueLimits | None = None
        # RateLimitGroup: no delivery before this time (ms).
        self.until = 0

    def configured(self) -> bool:
        return self.paused or self.limits is not None or self.until > 0

    def idle(self) -> bool:
        return not (self.waiting or self.delayed or self.active or self.configured())

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"paused": self.paused, "until": self.until}
        if self.limits is not None:
            cfg["limits"] = self.limits.config()
        return cfg

    def load(self, cfg: Mapping[str, Any]) -> None:
        self.paused = bool(cfg.get("paused"))
        self.until = int(cfg.get("until") or 0)
        if cfg.get("limits"):
            self.limits = QueueLimits.from_config(cfg["limits"])

    def room(self, now: int, taken: int) -> int:
        """How many more jobs this group may hand out now, `taken` already taken this pull."""
        if self.paused:
            return 0
        if self.until:
            if self.until > now:
                return 0
            self.until = 0  # passed: the group is no longer configured by it
        limits = self.limits
        if limits is None:
            return 1 << 30
        return limits.cap(self.active + taken, 1 << 30, now)

    def wakes_at(self, now: int) -> int | None:
        """When a held-back pull may find room here: `now` if it has room already, a later
        time for a rate window or manual limit that reopens, None if only an ACK, a resume or
        a settings change can give it room."""
        if self.paused:
            return None
        if self.until > now:
            return self.until
        limits = self.limits
        if limits is None:
            return now
        if limits.concurrency is not None and self.active >= limits.concurrency:
            return None
        if limits.rate is not None and limits.ttl(now) > 0:
            return limits.log[0][0] + limits.window  # the oldest delivery leaves the window
        return now

    def ttl(self, now: int, max_jobs: int | None) -> int:
        """GetGroupRateLimitTtl: ms until the group may be handed jobs again under its rate
        limit (0: it may now), -2 when it has no rate limit of any kind."""
        if self.until > now:
            return self.until - now
        return self.limits.ttl(now, max_jobs) if self.limits is not None else -2

    def push(self, job: Job) -> None:
        key = (job.priority, job.run_at, job.seq, job.id)
        job.hkey = key
        heappush(self.ready, key)

    def pop(self, jobs: Mapping[str, Job]) -> Job | None:
        heap = self.ready
        while heap:
            key = heappop(heap)
            job = jobs.get(key[-1])
            if job is not None and job.hkey is key and job.state == WAITING:
                job.hkey = None
                return job
        return None


class GroupTable:
    """Every group of one queue that holds jobs or settings."""

    __slots__ = ("blocked", "configured_ids", "freed", "groups", "jobs", "reopen", "ring")

    def __init__(self, jobs: Mapping[str, Job]) -> None:
        self.jobs = jobs
        self.groups: dict[str, Group] = {}
        # The groups holding settings, kept up to date by `sync` after every settings change,
        # so the cap check and `configured` cost O(1), not a walk of every group. A
        # `RateLimitGroup` deadline that passes leaves its group here until `prune`.
        self.configured_ids: set[str] = set()
        # Groups with waiting jobs, in serving order; the left end is served next.
        self.ring: deque[str] = deque()
        # Groups skipped by a pull for want of room while they had jobs waiting, each with the
        # time its rate window or manual limit reopens (None: only an ACK, a resume or a
        # settings change gives it room). Watching them costs O(log n) per change, never a
        # walk of them all: `reopen` is a heap of those times (entries whose time no longer
        # matches `blocked` are stale and skipped), and `freed` is set when an active job of
        # a blocked group ends.
        self.blocked: dict[str, int | None] = {}
        self.reopen: list[tuple[int, str]] = []
        self.freed = False

    def get(self, gid: str) -> Group:
        group = self.groups.get(gid)
        if group is None:
            group = self.groups[gid] = Group()
        return group

    def drop_if_idle(self, gid: str) -> None:
        group = self.groups.get(gid)
        if group is not None and group.idle() and not group.in_ring:
            del self.groups[gid]
            self.blocked.pop(gid, None)
            self.configured_ids.discard(gid)  # a lapsed deadline was its last setting

    # -- persisted settings ----------------------------------------------------------------

    def sync(self, gid: str) -> dict[str, Any] | None:
        """Record whether group `gid` holds settings after a change; return its persisted
        settings (None: it holds none, its stored row goes)."""
        group = self.groups.get(gid)
        if group is not None and group.configured():
            self.configured_ids.add(gid)
            return group.config()
        self.configured_ids.discard(gid)
        return None

    def config(self) -> dict[str, Any]:
        """The settings of every configured group (for reads and tests; never persisted
        whole: each group has its own row, see `_group_ops`)."""
        return {gid: self.groups[gid].config() for gid in sorted(self.configured_ids)}

    def load(self, cfg: Mapping[str, Any]) -> None:
        for gid, entry in cfg.items():
            if isinstance(entry, Mapping):
                self.get(str(gid)).load(entry)
                self.sync(str(gid))

    def configured(self) -> bool:
        return bool(self.configured_ids)

    def configured_count(self) -> int:
        return len(self.configured_ids)

    def prune(self, now: int) -> None:
        """Forget groups whose only setting was a `RateLimitGroup` deadline that passed.
        O(configured groups): run only when the cap would refuse a new group."""
        for gid in list(self.configured_ids):
            group = self.groups.get(gid)
            if group is not None and group.until and group.until <= now:
                group.until = 0
            self.sync(gid)
            self.drop_if_idle(gid)

    # -- what the engine's state changes tell the table -----------------------------------

    def divert(self, jobs: Iterable[Job], held: set[str]) -> list[Job]:
        """Put the grouped jobs among `jobs` (entering the waiting state) on their group's
        heap, except `held` ones (see `QueueState.push_ready_all`); returns the ungrouped
        ones, for the queue's own heap."""
        plain: list[Job] = []
        for job in jobs:
            gid = group_of(job)
            if gid is None:
                plain.append(job)
                continue
            if held and job.id in held:
                job.hkey = None
                continue
            group = self.get(gid)
            group.push(job)
            if len(group.ready) > 64 and len(group.ready) > 2 * group.waiting:
                self._compact(group)
            if not group.in_ring and not group.paused:
                group.in_ring = True
                self.ring.append(gid)
        return plain

    def resumed(self, gid: str) -> None:
        """Group `gid` was resumed: back in the ring if it has jobs waiting."""
        group = self.groups.get(gid)
        if group is not None and group.waiting and not group.in_ring and not group.paused:
            group.in_ring = True
            self.ring.append(gid)

    def _compact(self, group: Group) -> None:
        """Drop the dead entries of a group's heap (reprioritised or cancelled jobs), so that
        they never outnumber the live ones by more than 2x."""
        jobs = self.jobs
        live = []
        for key in group.ready:
            job = jobs.get(key[-1])
            if job is not None and job.hkey is key:
                live.append(key)
        heapify(live)
        group.ready = live

    def entered(self, jobs: Iterable[Job], state: str, step: int) -> None:
        """Count grouped jobs entering (`step` 1) or leaving (-1) `state`."""
        if state != WAITING and state != DELAYED and state != ACTIVE:
            return
        for job in jobs:
            gid = group_of(job)
            if gid is None:
                continue
            group = self.get(gid)
            if state == WAITING:
                group.waiting += step
                if not group.waiting:
                    group.ready.clear()  # only dead entries are left
            elif state == DELAYED:
                group.delayed += step
            else:
                group.active += step
                if step < 0 and gid in self.blocked:
                    # A concurrency slot came free: wake parked pulls (a rate limit that still
                    # holds the group makes the woken pull skip it and block it again).
                    del self.blocked[gid]
                    self.freed = True
            if step < 0 and group.idle() and not group.in_ring:
                del self.groups[gid]
                self.blocked.pop(gid, None)
                self.configured_ids.discard(gid)

    # -- pulling ---------------------------------------------------------------------------

    def take(self, count: int, now: int) -> tuple[list[Job], list[Job]]:
        """Up to `count` jobs, one group at a time round-robin, within each group's limits.
        Returns (jobs to deliver, TTL-expired jobs to drop); both are still waiting."""
        live: list[Job] = []
        expired: list[Job] = []
        taken: dict[str, int] = {}
        ring, groups, jobs = self.ring, self.groups, self.jobs
        skipped = 0  # groups passed over in a row: a whole lap of them ends the pull
        while ring and len(live) < count and skipped < len(ring):
            gid = ring[0]
            group = groups[gid]
            if group.paused:
                # Out of the ring until ResumeGroup (`resumed`): a queue with thousands of
                # paused groups holding jobs costs its pulls nothing for them.
                ring.popleft()
                group.in_ring = False
                continue
            got = taken.get(gid, 0)
            if group.room(now, got) <= 0:
                self.block(gid, group.wakes_at(now))
                ring.rotate(-1)
                skipped += 1
                continue
            job = group.pop(jobs)
            if job is None:
                ring.popleft()
                group.in_ring = False
                self.drop_if_idle(gid)
                continue
            ttl = job.opts.get("ttl")
            if ttl and now >= job.created_at + ttl:
                expired.append(job)
                continue
            skipped = 0
            live.append(job)
            taken[gid] = got + 1
            if group.limits is not None:
                group.limits.note(1, now)
            ring.rotate(-1)
        return live, expired

    # -- waking held-back pulls ------------------------------------------------------------

    def block(self, gid: str, at: int | None) -> None:
        """Watch group `gid`, skipped for want of room, until `at` (None: until an ACK)."""
        known = self.blocked.get(gid, _UNSEEN)
        self.blocked[gid] = at
        if at is not None and at != known:
            heap = self.reopen
            heappush(heap, (at, gid))
            if len(heap) > 2 * len(self.blocked) + 64:
                self.reopen = [(t, g) for g, t in self.blocked.items() if t is not None]
                heapify(self.reopen)

    def unblock(self, gid: str) -> None:
        """A settings change: the change itself wakes parked pulls (see `_group_ops`)."""
        self.blocked.pop(gid, None)

    def wake(self, now: int) -> bool:
        """True if a held-back group may have room now (its entry is cleared). O(log n) per
        group whose time came, O(1) when none did."""
        woke, self.freed = self.freed, False
        heap, blocked = self.reopen, self.blocked
        while heap and heap[0][0] <= now:
            at, gid = heappop(heap)
            if blocked.get(gid, _UNSEEN) != at:
                continue  # stale: unblocked, or watched for another time since
            group = self.groups.get(gid)
            if group is None or not group.ready:
                del blocked[gid]
                continue
            again = group.wakes_at(now)
            if again is not None and again <= now:
                del blocked[gid]
                woke = True
            else:
                blocked[gid] = None
                self.block(gid, again)
        return woke

    def next_wake(self) -> int | None:
        """The earliest time a held-back group's rate window or manual limit may reopen (an
        entry may be stale: the tick at that time then finds nothing to do)."""
        if self.freed:
            return 0
        heap, blocked = self.reopen, self.blocked
        while heap and blocked.get(heap[0][1], _UNSEEN) != heap[0][0]:
            heappop(heap)  # stale: never a deadline
        return heap[0][0] if heap else None

    # -- reads -----------------------------------------------------------------------------

    def depth(self, gid: str) -> int:
        group = self.groups.get(gid)
        return group.waiting + group.delayed if group is not None else 0

    def total_depth(self, per_group: int | None) -> int:
        total = 0
        for group in self.groups.values():
            depth = group.waiting + group.delayed
            total += depth if per_group is None else min(depth, per_group)
        return total


_UNSEEN: Any = object()


def group_size_error(table: GroupTable | None, entries: Sequence[Mapping[str, Any]]) -> str | None:
    """Why pushing `entries` (in order) would overfill a group with a `groupMaxSize`, or None.

    Checked before anything is admitted, so a push that would overfill a group admits nothing
    (bunqueue's check is atomic too). Each entry counts against its group's depth (waiting and
    delayed jobs) as if the entries before it were admitted.
    """
    added: dict[str, int] = {}
    many = len(entries) > 1
    for index, entry in enumerate(entries):
        gid = entry.get("groupId")
        if gid is None:
            continue
        gid = str(gid)
        depth = (table.depth(gid) if table is not None else 0) + added.get(gid, 0)
        cap = entry.get("groupMaxSize")
        error = None
        if cap is not None:
            if not is_number(cap) or not math.isfinite(cap) or cap != int(cap) or cap < 1:
                error = "groupMaxSize must be a positive integer"
            elif depth >= cap:
                error = f"Group {gid} has reached its maximum size of {int(cap)}"
        if error:
            return f"jobs[{index}]: {error}" if many else error
        added[gid] = added.get(gid, 0) + 1
    return None
