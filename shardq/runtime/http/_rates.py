"""Per-queue throughput for the dashboard: pushed/s and completed/s over the last few seconds.

Each shard keeps, per queue, two running totals since it started (jobs admitted, jobs
completed), which `GetJobCounts` returns with `totals: true`. This process samples them when
a page asks (at most one sample a second per queue) and divides the difference by the time
between the oldest sample of the window and now. Nothing runs while nobody looks, and the hot
path pays one addition per batch in the shard. A total that went down means its shard
restarted (the totals start again at zero): the samples before it are dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = ["WINDOW_S", "QueueRates"]

# Long enough to span two refreshes of the dashboard (every 5 s), short enough to show a
# burst that has stopped as stopped.
WINDOW_S: Final = 10.0
_MIN_GAP_S: Final = 1.0  # below this a difference says more about timing than throughput

Sample = tuple[float, int, int]  # (monotonic time, pushed, completed)


def _total(totals: Mapping[str, Any], key: str) -> int:
    value = totals.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class QueueRates:
    def __init__(self) -> None:
        self._samples: dict[str, deque[Sample]] = {}

    def observe(self, name: str, totals: Mapping[str, Any], now: float) -> dict[str, Any]:
        """Record `totals` ({pushed, completed}) of queue `name` at monotonic `now`; return
        `{pushPerSec, completePerSec}`, each None until two samples a second apart exist."""
        pushed, completed = _total(totals, "pushed"), _total(totals, "completed")
        samples = self._samples.setdefault(name, deque())
        if samples and (pushed < samples[-1][1] or completed < samples[-1][2]):
            samples.clear()
        if not samples or now - samples[-1][0] >= _MIN_GAP_S:
            samples.append((now, pushed, completed))
        while len(samples) >= 2 and samples[1][0] <= now - WINDOW_S:
            samples.popleft()
        since, pushed_then, completed_then = samples[0]
        span = now - since
        if span < _MIN_GAP_S:
            return {"pushPerSec": None, "completePerSec": None}
        return {
            "pushPerSec": round((pushed - pushed_then) / span, 2),
            "completePerSec": round((completed - completed_then) / span, 2),
        }

    def keep_only(self, names: Iterable[str]) -> None:
        """Forget the queues not in `names` (every queue there is): the table stays as large
        as the server's list of queues."""
        live = set(names)
        for name in [n for n in self._samples if n not in live]:
            del self._samples[name]
