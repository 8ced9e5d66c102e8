"""Per-queue rate limit and concurrency cap (`QueueLimiter`, the engine's `limiter` component):
RateLimit (with its `ttl`), RateLimitClear, SetConcurrency, ClearConcurrency and
GetQueueLimits (docs/protocol.md §16).

A queue without limits has `limits` None and pays one attribute test per pull. A limited queue
hands out no more than its limits allow (`QueueLimits.cap`), and parked pulls are woken, without
polling, the moment capacity returns: at the deadline when the rate window reopens
(`next_deadline`), and after the command or tick that took an active job below the cap.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from typing import Any

from shardq.errors import CommandError

from ._bounds import count_error, span_error
from ._effects import Effects
from ._lifecycle import ACTIVE
from ._options import is_number
from ._queue import QueueState
from ._queue_limits import DEFAULT_WINDOW_MS, QueueLimits
from ._state import JobStore

__all__ = ["QueueLimiter", "QueueLimits"]


def _limit(cmd: Mapping[str, Any], *, positive: bool) -> int:
    value = cmd.get("limit")
    if not is_number(value) or isinstance(value, bool) or not math.isfinite(value):
        raise CommandError("limit must be a finite number")
    if positive and value < 1:
        raise CommandError("limit must be at least 1")
    _refuse(count_error(value, "limit"))
    return max(int(value), 0)


def _refuse(error: str | None) -> None:
    if error is not None:
        raise CommandError(error)


class QueueLimiter:
    """The engine's queue-limits component. Owns the watch over limited queues (below); each
    queue's `QueueLimits` lives on its `QueueState`. The job store tells it when a pull was
    held back (`held_back`) and when an active job of a blocked queue ended (`freed_active`)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.queues = store.queues  # the store's own dict, never replaced
        # Limited queues whose pulls were held back: the only ones to watch for capacity. They
        # are watched in O(log n) per change, never walked: `reopen` is a heap of (time the
        # rate window reopens, queue), stale entries skipped; `freed` names the blocked
        # queues an active job left since the last check (`_state`).
        self.blocked: set[str] = set()
        self.reopen: list[tuple[int, str]] = []
        self.freed: set[str] = set()
        # (time, queue) at which a RateLimit given a `ttl` clears itself; stale entries (the
        # limit was replaced or cleared since) are skipped.
        self.expiries: list[tuple[int, str]] = []

    def held_back(self, queue: str) -> None:
        self.blocked.add(queue)
        q = self.queues.get(queue)
        at = q.limits.reopens_at() if q is not None and q.limits is not None else None
        if at is not None:
            heap = self.reopen
            heapq.heappush(heap, (at, queue))
            if len(heap) > 2 * len(self.blocked) + 64:
                self._rebuild_reopen()

    def freed_active(self, q: QueueState) -> None:
        """An active job of `q` (held back by its concurrency cap) ended: check it next."""
        if q.name in self.blocked:
            self.freed.add(q.name)

    def _rebuild_reopen(self) -> None:
        entries = []
        for name in self.blocked:
            q = self.queues.get(name)
            at = q.limits.reopens_at() if q is not None and q.limits is not None else None
            if at is not None:
                entries.append((at, name))
        heapq.heapify(entries)
        self.reopen = entries

    # -- commands --------------------------------------------------------------------------

    def cmd_rate_limit(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        limit = _limit(cmd, positive=False)
        duration = cmd.get("duration")
        if duration is not None and (
            not is_number(duration) or not math.isfinite(duration) or duration <= 0
        ):
            raise CommandError("duration must be a positive number")
        ttl = cmd.get("ttl")
        if ttl is not None and (not is_number(ttl) or not math.isfinite(ttl) or ttl <= 0):
            raise CommandError("ttl must be a positive number")
        _refuse(span_error(duration, now, "duration") or span_error(ttl, now, "ttl"))
        limits = self._limits_of(cmd)
        limits.rate = limit
        limits.window = int(duration) if duration is not None else DEFAULT_WINDOW_MS
        limits.rate_until = None if ttl is None else now + int(ttl)
        if limits.rate_until is not None:
            heapq.heappush(self.expiries, (limits.rate_until, str(cmd.get("queue", ""))))
        return self._saved(fx, cmd)

    def cmd_rate_limit_clear(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        limits = self._limits_of(cmd)
        limits.rate, limits.rate_until = None, None
        return self._saved(fx, cmd)

    def cmd_get_queue_limits(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        max_jobs = cmd.get("maxJobs")
        if max_jobs is not None and (not is_number(max_jobs) or not math.isfinite(max_jobs)):
            raise CommandError("maxJobs must be a finite number")
        q = self.queues.get(str(cmd.get("queue", "")))
        limits = q.limits if q is not None else None
        if q is None or limits is None:
            rate, ttl, cap, maxed = None, -2, None, False
        else:
            rate = None if limits.rate is None else {"max": limits.rate, "duration": limits.window}
            ttl = limits.ttl(now, None if max_jobs is None else int(max_jobs))
            cap = limits.concurrency
            maxed = ttl > 0 or (cap is not None and q.counts[ACTIVE] >= cap)
        view = {"rateLimit": rate, "rateLimitTtl": ttl, "concurrencyLimit": cap, "maxed": maxed}
        return {"ok": True, "data": {"limits": view}}

    def cmd_set_concurrency(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        cap = _limit(cmd, positive=True)  # checked before the queue gets a limits record
        self._limits_of(cmd).concurrency = cap
        return self._saved(fx, cmd)

    def cmd_clear_concurrency(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        self._limits_of(cmd).concurrency = None
        return self._saved(fx, cmd)

    def _limits_of(self, cmd: Mapping[str, Any]) -> QueueLimits:
        q = self.store.queue(str(cmd.get("queue", "")))
        if q.limits is None:
            q.limits = QueueLimits()
        return q.limits

    def _saved(self, fx: Effects, cmd: Mapping[str, Any]) -> dict[str, Any]:
        q = self.store.queue(str(cmd.get("queue", "")))
        if q.limits is not None and q.limits.empty():
            q.limits = None
        fx.mutations.append(("queue", q.name, q.config()))
        fx.events.append(("ready", q.name, ""))  # a raised or cleared limit may free pulls
        return {"ok": True}

    # -- waking parked pulls ---------------------------------------------------------------

    def wake(self, fx: Effects, now: int) -> None:
        """Emit "ready" for each queue whose held-back pulls may now be served: those an
        active job left, and those whose rate window reopened (from the heap's top)."""
        woken: set[str] = set()
        if self.freed:
            freed, self.freed = self.freed, set()
            for name in freed:
                limits = self._blocked_limits(name)
                if limits is not None and limits.conc_blocked and self._has_slot(name, limits):
                    limits.conc_blocked = False
                    woken.add(name)
        heap = self.reopen
        while heap and heap[0][0] <= now:
            at, name = heapq.heappop(heap)
            limits = self._blocked_limits(name)
            if limits is None or not limits.rate_blocked:
                continue
            reopens = limits.reopens_at()
            if reopens is not None and reopens <= now:
                limits.rate_blocked = False
                woken.add(name)
            elif reopens is not None and reopens != at:
                heapq.heappush(heap, (reopens, name))
        for name in sorted(woken):
            fx.events.append(("ready", name, ""))
            limits = self._blocked_limits(name)
            if limits is None or not (limits.conc_blocked or limits.rate_blocked):
                self.blocked.discard(name)

    def _has_slot(self, name: str, limits: QueueLimits) -> bool:
        return self.queues[name].counts[ACTIVE] < (limits.concurrency or 0)

    def _blocked_limits(self, name: str) -> QueueLimits | None:
        """The limits of blocked queue `name`; a queue gone or unlimited stops being watched."""
        q = self.queues.get(name) if name in self.blocked else None
        limits = q.limits if q is not None else None
        if limits is None:
            self.blocked.discard(name)
        return limits

    def _expire_rate_limits(self, fx: Effects, now: int) -> None:
        heap = self.expiries
        while heap and heap[0][0] <= now:
            at, name = heapq.heappop(heap)
            q = self.queues.get(name)
            limits = q.limits if q is not None else None
            if q is None or limits is None or limits.rate_until != at:
                continue
            limits.rate, limits.rate_until = None, None
            self._saved(fx, {"queue": name})

    def restored(self) -> None:
        """Watch the rate limits with a `ttl` that the store's queues came back with."""
        for q in self.queues.values():
            if q.limits is not None and q.limits.rate_until is not None:
                heapq.heappush(self.expiries, (q.limits.rate_until, q.name))

    def tick(self, fx: Effects, now: int) -> None:
        if self.expiries:
            self._expire_rate_limits(fx, now)
        if self.blocked:
            self.wake(fx, now)

    def deadline(self) -> int | None:
        """When a rate limit's `ttl` runs out or a held-back queue may have room, or None."""
        deadline: int | None = None
        if self.expiries and (deadline is None or self.expiries[0][0] < deadline):
            deadline = self.expiries[0][0]
        heap = self.reopen
        while heap and heap[0][1] not in self.blocked:
            heapq.heappop(heap)  # its queue was woken or dropped since: never a deadline
        # A top whose queue is still blocked may yet be stale: that tick then does nothing.
        at = 0 if self.freed and self.blocked else heap[0][0] if heap else None
        if at is not None and (deadline is None or at < deadline):
            deadline = at
        return deadline
