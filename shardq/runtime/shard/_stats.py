"""A shard's answer to Stats: its counts, which the front end sums over all shards."""

from __future__ import annotations

from typing import Any, Final

from shardq.core import Engine

__all__ = ["shard_stats"]

_COUNT_KEYS: Final = ("active", "delayed", "completed", "failed")


def shard_stats(
    engine: Engine, now: int, *, stalled: bool, direct: dict[str, Any] | None
) -> dict[str, Any]:
    """The Stats reply of one shard. `stalled`: this shard sees its writer stalled (storage
    degraded); `direct`: its direct port's counts and latency histograms (`_direct`), None
    while it has none."""
    totals: dict[str, Any] = dict.fromkeys(("waiting", *_COUNT_KEYS, "dlq"), 0)
    for name in engine.apply({"cmd": "ListQueues"}, now).reply.get("queues", ()):
        counts = engine.apply({"cmd": "GetJobCounts", "queue": name}, now).reply["counts"]
        totals["waiting"] += counts["waiting"] + counts["prioritized"] + counts["paused"]
        for key in _COUNT_KEYS:
            totals[key] += counts[key]
    totals["dlq"] = totals["failed"]
    # Summed by the front end: how many shards see their writer stalled (the HTTP port's
    # /health turns degraded on it; the writer cannot say so while it does not run).
    totals["storageStalled"] = int(stalled)
    if direct is not None:
        totals.update(direct)
    # Jobs held in memory, and under a head budget the cold ones left in storage.
    totals["residentJobs"] = len(engine.jobs)
    head = engine.head
    totals["coldJobs"] = head.cold_total() if head is not None else 0
    # The memory budget (0: off), the estimate of what the resident jobs take, and
    # whether jobs that cannot go cold alone pass it (`core._budget`).
    memory = engine.memory
    totals["memoryBudgetBytes"] = memory.budget if memory is not None else 0
    totals["residentBytes"] = memory.resident_bytes() if memory is not None else 0
    totals["memoryOver"] = int(memory.over) if memory is not None else 0
    return {"ok": True, "stats": totals}
