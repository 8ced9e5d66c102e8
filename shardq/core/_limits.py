"""Per-queue rate limit and concurrency cap: RateLimit, RateLimitClear, SetConcurrency,
ClearConcurrency (docs/protocol.md §16).

A queue without limits has `limits` None and pays one attribute test per pull. A limited queue
hands out no more than its limits allow (`QueueLimits.cap`), and parked pulls are woken, without
polling, the moment capacity returns: at the deadline when the rate window reopens
(`next_deadline`), and after the command or tick that took an active job below the cap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from shardq.errors import CommandError

from ._lifecycle import ACTIVE
from ._mutations import Mutation
from ._options import is_number
from ._queue_limits import DEFAULT_WINDOW_MS, QueueLimits
from ._timers import Event, TimerOps

__all__ = ["LimitOps", "QueueLimits"]


def _limit(cmd: Mapping[str, Any], *, positive: bool) -> int:
    value = cmd.get("limit")
    if not is_number(value) or isinstance(value, bool) or not math.isfinite(value):
        raise CommandError("limit must be a finite number")
    if positive and value < 1:
        raise CommandError("limit must be at least 1")
    return max(int(value), 0)


class LimitOps(TimerOps):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Limited queues whose pulls were held back: the only ones to watch for capacity.
        self.blocked: set[str] = set()

    def held_back(self, queue: str) -> None:
        self.blocked.add(queue)

    # -- commands --------------------------------------------------------------------------

    def cmd_rate_limit(self, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        limit = _limit(cmd, positive=False)
        duration = cmd.get("duration")
        if duration is not None and (
            not is_number(duration) or not math.isfinite(duration) or duration <= 0
        ):
            raise CommandError("duration must be a positive number")
        limits = self._limits_of(cmd)
        limits.rate = limit
        limits.window = int(duration) if duration is not None else DEFAULT_WINDOW_MS
        return self._saved(cmd)

    def cmd_rate_limit_clear(self, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        self._limits_of(cmd).rate = None
        return self._saved(cmd)

    def cmd_set_concurrency(self, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        self._limits_of(cmd).concurrency = _limit(cmd, positive=True)
        return self._saved(cmd)

    def cmd_clear_concurrency(self, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        self._limits_of(cmd).concurrency = None
        return self._saved(cmd)

    def _limits_of(self, cmd: Mapping[str, Any]) -> QueueLimits:
        q = self.queue(str(cmd.get("queue", "")))
        if q.limits is None:
            q.limits = QueueLimits()
        return q.limits

    def _saved(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        q = self.queue(str(cmd.get("queue", "")))
        if q.limits is not None and q.limits.empty():
            q.limits = None
        self.out.append(("queue", q.name, q.config()))
        self.events.append(("ready", q.name, ""))  # a raised or cleared limit may free pulls
        return {"ok": True}

    # -- waking parked pulls ---------------------------------------------------------------

    def wake_limited(self, now: int) -> None:
        """Emit "ready" for each queue whose held-back pulls may now be served."""
        for name in list(self.blocked):
            q = self.queues.get(name)
            limits = q.limits if q is not None else None
            if q is None or limits is None:
                self.blocked.discard(name)
                continue
            woke = False
            if limits.conc_blocked and q.counts[ACTIVE] < (limits.concurrency or 0):
                limits.conc_blocked, woke = False, True
            at = limits.reopens_at()
            if at is not None and at <= now:
                limits.rate_blocked, woke = False, True
            if woke:
                self.events.append(("ready", name, ""))
            if not (limits.conc_blocked or limits.rate_blocked):
                self.blocked.discard(name)

    def tick(self, now: int) -> tuple[list[Event], list[Mutation]]:
        events, out = super().tick(now)
        if self.blocked:
            self.wake_limited(int(now))
        return events, out

    def next_deadline(self) -> int | None:
        deadline = super().next_deadline()
        if not self.blocked:
            return deadline
        for name in self.blocked:
            q = self.queues.get(name)
            at = q.limits.reopens_at() if q is not None and q.limits is not None else None
            if at is not None and (deadline is None or at < deadline):
                deadline = at
        return deadline
