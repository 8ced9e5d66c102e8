"""What the HTTP process says about this node's place among several (docs/cluster.md):
whether it holds its share (`/ready`), and the cluster families of `/prometheus`.

Both read the map the writer's lease thread publishes in the run directory
(`shardq.cluster._map`, `cluster.json`); the forward count comes from the front end
(`ClusterStatus`' `forwards`). A node on SQLite is alone: it holds every partition, always
its share, and has no lease rounds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shardq.cluster._map import read_map

__all__ = ["ClusterCollector", "share_check"]


def share_check(run_dir: str) -> tuple[bool, dict[str, Any]]:
    """(holds its share, what `/ready` shows about it): held partitions at least the fair
    share of the live nodes, `ceil(partitions / live nodes)`, by a renewal still valid, once
    the first lease round ran."""
    doc = read_map(run_dir)
    if doc is None:
        return False, {"reason": "no lease round yet: this node holds no partitions"}
    live = sum(1 for n in doc.get("nodes", []) if n.get("alive")) or 1
    partitions = int(doc.get("partitions", 0))
    share = math.ceil(partitions / live)
    valid = time.monotonic() < float(doc.get("valid_until", 0.0))
    held = len(doc.get("held", [])) if valid else 0
    facts = {"held": held, "share": share, "liveNodes": live}
    if held >= share:
        return True, {"cluster": facts}
    why = "are not renewed" if not valid else "are fewer than its share"
    return False, {"cluster": facts, "reason": f"this node's partition leases {why}"}


class ClusterCollector(Collector):
    """shardq_partitions_owned, shardq_lease_renew_seconds, shardq_forwards_total."""

    def __init__(self, run_dir: str, cluster_status: Mapping[str, Any]) -> None:
        self._doc = read_map(run_dir) or {}
        self._forwards = cluster_status.get("forwards", 0)

    def collect(self) -> Iterator[Metric]:
        doc = self._doc
        valid = time.monotonic() < float(doc.get("valid_until", 0.0))
        yield GaugeMetricFamily(
            "shardq_partitions_owned",
            "Partitions this node holds a valid lease on now",
            len(doc.get("held", [])) if valid else 0,
        )
        yield GaugeMetricFamily(
            "shardq_lease_renew_seconds",
            "How long this node's last lease round took (heartbeat, renew, rebalance)",
            float(doc.get("renew_ms", 0.0)) / 1000,
        )
        forwards = self._forwards if isinstance(self._forwards, int) else 0
        yield CounterMetricFamily(
            "shardq_forwards",
            "Commands forwarded to the node holding their queue, and job ids looked up on "
            "the other nodes (rate() gives forwards per second)",
            forwards,
        )
