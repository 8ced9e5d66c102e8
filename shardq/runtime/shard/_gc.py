"""Garbage-collector settings for the processes that hold many live objects.

A shard keeps up to 50,000 completed jobs plus every queued and active one in memory, and each
command allocates short-lived maps. With CPython's default thresholds (700, 10, 10) a young
collection runs every few hundred allocations and full collections keep walking the retained
jobs: measured at 37 % of the engine's time on a bulk workload (BENCHMARKS.md). Raising the
young-generation threshold makes collections rare without turning the collector off, so
reference cycles are still reclaimed.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["GC_THRESHOLDS", "tune_gc"]

GC_THRESHOLDS: Final = (50_000, 20, 10)


def tune_gc() -> None:
    """Apply shardq's thresholds and move everything allocated so far out of the collector's
    sight (start-up state and recovered records are long-lived)."""
    gc.set_threshold(*GC_THRESHOLDS)
    gc.freeze()
