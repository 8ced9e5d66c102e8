"""What a queue's rate limit and concurrency cap allow a pull to take (see `_limits`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_WINDOW_MS", "QueueLimits"]

DEFAULT_WINDOW_MS = 1000


class QueueLimits:
    """The limits of one queue and what the rate limit has handed out in its window."""

    __slots__ = (
        "conc_blocked",
        "concurrency",
        "log",
        "rate",
        "rate_blocked",
        "rate_until",
        "used",
        "window",
    )

    def __init__(self) -> None:
        self.rate: int | None = None
        self.window = DEFAULT_WINDOW_MS
        self.concurrency: int | None = None
        # RateLimit's `ttl`: the rate limit clears itself at this time (ms); None: never.
        self.rate_until: int | None = None
        # (time, jobs handed out) per pull inside the window, oldest first; `used` sums them.
        self.log: deque[tuple[int, int]] = deque()
        self.used = 0
        # A pull got less than it asked for because of this limit: wake parked pulls later.
        self.rate_blocked = False
        self.conc_blocked = False

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> QueueLimits:
        limits = cls()
        limits.rate = cfg.get("rate")
        limits.window = int(cfg.get("window") or DEFAULT_WINDOW_MS)
        limits.concurrency = cfg.get("concurrency")
        limits.rate_until = cfg.get("rateUntil")
        return limits

    def config(self) -> dict[str, Any]:
        cfg = {"rate": self.rate, "window": self.window, "concurrency": self.concurrency}
        if self.rate_until is not None:
            cfg["rateUntil"] = self.rate_until
        return cfg

    def empty(self) -> bool:
        return self.rate is None and self.concurrency is None

    def _slide(self, now: int) -> None:
        log = self.log
        while log and log[0][0] <= now - self.window:
            self.used -= log.popleft()[1]

    def cap(self, active: int, count: int, now: int) -> int:
        """How many of `count` jobs a pull may take now (0 or more)."""
        allowed = count
        if self.concurrency is not None and self.concurrency - active < allowed:
            allowed = max(self.concurrency - active, 0)
            self.conc_blocked = True
        if self.rate is not None:
            self._slide(now)
            if self.rate - self.used < allowed:
                allowed = max(self.rate - self.used, 0)
                self.rate_blocked = True
        return allowed

    def note(self, taken: int, now: int) -> None:
        if taken and self.rate is not None:
            self.log.append((now, taken))
            self.used += taken

    def ttl(self, now: int, max_jobs: int | None = None) -> int:
        """ms until the rate window has room for a job (0: it has now; -2: no rate limit).
        `max_jobs` counts the window as full at that many jobs instead of at the limit."""
        if self.rate is None:
            return -2
        self._slide(now)
        cap = self.rate if max_jobs is None else max_jobs
        if self.used < cap or not self.log:
            return 0 if self.used < cap else self.window
        return max(self.log[0][0] + self.window - now, 0)

    def reopens_at(self) -> int | None:
        """When the oldest delivery leaves the rate window, if a pull was held back by it."""
        if not self.rate_blocked:
            return None
        return self.log[0][0] + self.window if self.log else 0
