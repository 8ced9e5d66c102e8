"""The `ClusterStatus` command (`GET /cluster`, `shardq cluster status`): the nodes on this
node's database and the partitions each holds (docs/cluster.md).

On PostgreSQL the answer is the map the writer's lease thread last published in the run
directory (`shardq.cluster._map`); a node alone (SQLite) answers itself, holding every
partition. Either way: `{ok, nodes: [{id, address, alive, partitions}], partitions, forwards}`
(`forwards`: the commands this node forwarded to others since it started).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardq.cluster._map import cluster_view, read_map, single_node_view
from shardq.protocol import error_reply
from shardq.runtime._spec import ChildSpec
from shardq.runtime.frontend._replies import answer

__all__ = ["ClusterCommand"]


class ClusterCommand:
    def __init__(self, spec: ChildSpec, forwards: Callable[[], int] = lambda: 0) -> None:
        self._forwards = forwards  # commands this node forwarded (`/prometheus`)
        self._run_dir = spec.run_dir
        self._external = spec.external_store
        cluster = spec.cluster
        self._alone = single_node_view(cluster.node_id, cluster.advertise, cluster.partitions)

    @property
    def handlers(self) -> dict[str, Any]:
        return {"ClusterStatus": self._handle}

    def _handle(self, client: Any, req: object, frame: dict[str, Any]) -> None:
        if not self._external:
            answer(client, req, {"ok": True, **self._alone, "forwards": 0})
            return
        doc = read_map(self._run_dir)
        if doc is None:
            answer(client, req, error_reply("Cluster map unavailable: no lease round yet"))
            return
        reply = {"ok": True, **cluster_view(doc), "forwards": self._forwards()}
        answer(client, req, reply)
