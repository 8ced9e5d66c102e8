"""The node-by-node merges of the cluster-wide answers (`frontend._aggregate`), on replies
shaped as the front end builds them. The real nodes answering them: tests/storage/
test_cluster_aggregates.py."""

from __future__ import annotations

from typing import Any

from shardq.runtime.frontend._aggregate import (
    merge_node_metrics,
    merge_node_queues,
    merge_node_stats,
    merge_node_workers,
)
from shardq.runtime.frontend._metrics import LATENCY_BOUNDS_MS

BUCKETS = len(LATENCY_BOUNDS_MS) + 1


def _histogram(values: dict[int, int], total: float) -> dict[str, Any]:
    counts = [0] * BUCKETS
    for bucket, n in values.items():
        counts[bucket] = n
    return {"bounds": list(LATENCY_BOUNDS_MS), "counts": counts, "sum": total}


def test_stats_sum_counts_and_rates_and_keep_this_nodes_uptime() -> None:
    here = {"ok": True, "stats": {"waiting": 3, "active": 1, "dlq": 0, "uptime": 50,
                                  "pushPerSec": 1.25, "pullPerSec": 0.0}}  # fmt: skip
    peer = {"ok": True, "node": "h:2", "stats": {"waiting": 4, "active": 0, "dlq": 2,
                                                 "uptime": 9000, "pushPerSec": 2.5,
                                                 "pullPerSec": 0.1}}  # fmt: skip
    merged = merge_node_stats(here, [peer])
    assert merged == {"ok": True, "stats": {"waiting": 7, "active": 1, "dlq": 2, "uptime": 50,
                                            "pushPerSec": 3.75, "pullPerSec": 0.1}}  # fmt: skip


def test_queues_are_the_sorted_union() -> None:
    merged = merge_node_queues({"ok": True, "queues": ["b", "a"]},
                               [{"ok": True, "queues": ["c", "a"]}])  # fmt: skip
    assert merged == {"ok": True, "queues": ["a", "b", "c"]}


def test_metrics_sum_counters_and_read_averages_from_the_summed_histograms() -> None:
    def node(pushed: int, push: dict[str, Any], ack: dict[str, Any]) -> dict[str, Any]:
        metrics = {"totalPushed": pushed, "totalPulled": 1, "totalCompleted": 1,
                   "totalFailed": 0, "avgLatencyMs": 99.0, "avgProcessingMs": 99.0,
                   "memoryUsageMb": 10.5, "sqliteSizeMb": 0, "activeConnections": 0}  # fmt: skip
        latency = {"push": push, "pull": _histogram({}, 0.0), "ack": ack}
        return {"ok": True, "metrics": metrics, "latency": latency,
                "shards": {"inFlight": [pushed]}}  # fmt: skip

    here = node(2, _histogram({3: 2}, 2.0), _histogram({4: 1}, 3.0))
    peer = node(5, _histogram({5: 1}, 7.0), _histogram({}, 0.0))
    merged = merge_node_metrics(here, [peer])
    m = merged["metrics"]
    assert (m["totalPushed"], m["totalPulled"], m["memoryUsageMb"]) == (7, 2, 21.0)
    # Push mean over both nodes (9 ms / 3), pull none: (3 + 0) / 2; ack 3 ms / 1.
    assert (m["avgLatencyMs"], m["avgProcessingMs"]) == (1.5, 3.0)
    assert (m["sqliteSizeMb"], m["activeConnections"]) == (0, 0)
    assert merged["latency"]["push"]["counts"][3:6] == [2, 0, 1]
    assert merged["shards"] == {"inFlight": [2]}  # this node's mailboxes only


def test_workers_one_node_after_the_other_with_summed_stats() -> None:
    def node(*ids: str) -> dict[str, Any]:
        stats = {"total": len(ids), "active": len(ids), "totalProcessed": 2,
                 "totalFailed": 1, "activeJobs": 0, "concurrencySlots": 3 * len(ids)}  # fmt: skip
        return {"ok": True, "data": {"workers": [{"id": i} for i in ids], "stats": stats}}

    merged = merge_node_workers(node("w1"), [node("w2", "w3"), node()])
    assert [w["id"] for w in merged["data"]["workers"]] == ["w1", "w2", "w3"]
    assert merged["data"]["stats"] == {"total": 3, "active": 3, "totalProcessed": 6,
                                       "totalFailed": 3, "activeJobs": 0,
                                       "concurrencySlots": 9}  # fmt: skip
