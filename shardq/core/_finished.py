"""Per-queue counts of jobs finished per minute: what queue-scoped `Metrics` answers.

bunqueue (after BullMQ's `getMetrics`) keeps, per queue and per outcome (`completed`, `failed`
for good), a total, the time and minute count of the last one, and a count per wall-clock
minute, newest first. These are counters in memory: a restart rebuilds them from the finished
jobs the shard still holds (each counted at its completion time), so a minute whose jobs were
evicted reads lower after a restart. At most `max_minutes` minutes are kept per series.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["FinishedLog", "metrics_reply"]

_MINUTE_MS: Final = 60_000


class _Series:
    __slots__ = ("buckets", "prev_count", "prev_ts", "total")

    def __init__(self) -> None:
        self.total = 0
        self.prev_ts = 0
        self.prev_count = 0
        self.buckets: dict[int, int] = {}


class FinishedLog:
    """The completed and failed series of one queue."""

    __slots__ = ("_series",)

    def __init__(self) -> None:
        self._series: dict[str, _Series] = {}

    def note(self, kind: str, count: int, at: int, max_minutes: int) -> None:
        series = self._series.get(kind)
        if series is None:
            series = self._series[kind] = _Series()
        minute = at // _MINUTE_MS
        buckets = series.buckets
        now_count = buckets.get(minute, 0) + count
        buckets[minute] = now_count
        series.total += count
        if at >= series.prev_ts:
            series.prev_ts, series.prev_count = at, now_count
        if len(buckets) > max_minutes:
            cutoff = max(buckets) - max_minutes
            for old in [m for m in buckets if m <= cutoff]:
                del buckets[old]

    def read(self, kind: str, max_minutes: int) -> tuple[dict[str, int], list[int]]:
        """`meta` and the per-minute counts, newest minute first, gaps as zeros."""
        series = self._series.get(kind)
        if series is None or not series.buckets:
            return {"count": 0, "prevTS": 0, "prevCount": 0}, []
        meta = {"count": series.total, "prevTS": series.prev_ts, "prevCount": series.prev_count}
        newest = max(series.buckets)
        oldest = max(min(series.buckets), newest - max_minutes + 1)
        data = [0] * (newest - oldest + 1)
        for minute, n in series.buckets.items():
            if minute >= oldest:
                data[newest - minute] = n
        return meta, data


def metrics_reply(
    log: FinishedLog | None, kind: str, start: int, end: int, max_minutes: int
) -> dict[str, Any]:
    """bunqueue's `{ok, data: {meta, data, count}}`; `start`/`end` index the minutes (end
    inclusive, -1 for the last), and `count` is the number of minutes before slicing."""
    data: list[int]
    if log is None:
        meta, data = {"count": 0, "prevTS": 0, "prevCount": 0}, []
    else:
        meta, data = log.read(kind, max_minutes)
    stop = len(data) if end == -1 else min(len(data), end + 1)
    page = data[start:stop] if start < stop else []
    return {"ok": True, "data": {"meta": meta, "data": page, "count": len(data)}}
