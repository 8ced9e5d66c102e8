"""Command latency histograms: the PUSH, PULL and ACK timings `Metrics` reports.

The front end times the commands it forwards (`frontend._metrics.Counters`); a shard times
those it serves itself, on its direct port and on the connections the front end handed it
(`shard._direct`), and reports them in its Stats (`directLatency`). The front end's `Metrics`
sums the two bucket by bucket (`sum_histograms`), and a cluster sums its nodes' likewise, so
the HTTP port's `shardq_{push,pull,ack}_latency_seconds` see every command wherever it was
served. A histogram travels as `{bounds, counts, sum}` in milliseconds: an upper bound per
bucket (`LATENCY_BOUNDS_MS`), a count per bucket with +Inf last, and the sum of the timings.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["LATENCY_BOUNDS_MS", "Latency", "histogram_mean", "sum_histograms"]

# Upper bounds (ms) of the latency buckets the HTTP port exposes as Prometheus histograms:
# from a pipelined command's tenth of a millisecond to a long-poll's seconds.
LATENCY_BOUNDS_MS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0,
                            5000.0)  # fmt: skip


class Latency:
    """A mean, plus a bucket count per `LATENCY_BOUNDS_MS` bound (the last one is +Inf)."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.buckets = [0] * (len(LATENCY_BOUNDS_MS) + 1)

    def add(self, ms: float) -> None:
        self.count += 1
        self.total += ms
        self.buckets[bisect.bisect_left(LATENCY_BOUNDS_MS, ms)] += 1

    def histogram(self) -> dict[str, Any]:
        return {"bounds": list(LATENCY_BOUNDS_MS), "counts": list(self.buckets), "sum": self.total}

    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def sum_histograms(raw: Sequence[object]) -> dict[str, Any] | None:
    """Histograms `{bounds, counts, sum}` with the same bounds, summed; None if none fits
    (anything else in `raw`, a histogram of other bounds among them, is passed over)."""
    merged: dict[str, Any] | None = None
    for value in raw:
        h = value if isinstance(value, Mapping) else {}
        counts, bounds = h.get("counts"), h.get("bounds")
        if not isinstance(counts, list) or not isinstance(bounds, list):
            continue
        total = h.get("sum")
        if merged is None:
            merged = {"bounds": list(bounds), "counts": list(counts), "sum": total or 0}
        elif bounds == merged["bounds"] and len(counts) == len(merged["counts"]):
            merged["counts"] = [a + b for a, b in zip(merged["counts"], counts, strict=True)]
            merged["sum"] += total if _number(total) else 0
    return merged


def histogram_mean(histogram: Mapping[str, Any] | None) -> float:
    """The mean timing of a `{bounds, counts, sum}` histogram (0.0 if it counts none)."""
    if not histogram:
        return 0.0
    count = sum(c for c in histogram.get("counts") or () if _number(c))
    total = histogram.get("sum")
    return total / count if count and isinstance(total, int | float) else 0.0
