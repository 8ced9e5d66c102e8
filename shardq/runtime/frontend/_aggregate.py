"""Cluster-wide answers for the commands that name no queue (docs/cluster.md, "Cluster-wide
answers").

Several nodes on one database: `Stats`, `ListQueues`, the legacy `Metrics` and `ListWorkers`
asked of any node answer for every node. The node asks its own shards (or its own registry)
and every live peer at once (`Router.gather_nodes`, `Router.peer_gather`); a peer answers such
a request, which comes on a `NoForward {node}` link, for itself alone, so nothing loops. The
replies are merged here, node by node:

- `Stats`: counts summed; `pushPerSec`/`pullPerSec` summed (each node counts what its front
  end served); `uptime` this node's.
- `ListQueues`: the sorted union (a queue is on one node; while a partition changes hands it
  may show on two, once here).
- `Metrics`: the counters summed, the latency histograms summed bucket by bucket and the
  averages taken from them, `memoryUsageMb` summed; `shards` (per shard: requests in flight,
  jobs in memory, cold jobs) this node's.
- `ListWorkers`: each node's workers, this node's first; the stats summed.

A peer that cannot answer (unreachable, a shard of its own restarting, ...) does not turn the
answer into an error: the nodes that did answer are merged and the reply names the others in
`unreachableNodes` (`host:port`, sorted; absent when every node answered). The first time a
node fails to answer it is logged, and again when it answers once more. This node's own
failure answers the error, as on one machine.

`local: true` on these commands asks for this node's answer alone: what `/health`, `/ready`
and the Prometheus exposition use, as each node is scraped on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import structlog

from shardq.runtime._latency import histogram_mean, sum_histograms
from shardq.runtime.frontend._forward import NODE_FIELD
from shardq.runtime.frontend._replies import Client, Reply
from shardq.runtime.frontend._router import Router

__all__ = [
    "UNREACHABLE",
    "NodeAnswers",
    "merge_node_metrics",
    "merge_node_queues",
    "merge_node_stats",
    "merge_node_workers",
]

UNREACHABLE: Final = "unreachableNodes"
LOCAL: Final = "local"  # the field asking for this node's answer alone
_MAX_REMEMBERED: Final = 1024  # nodes remembered as not answering (for the log), a bound
_log = structlog.get_logger()

MergeNodes = Callable[[Reply, list[Reply]], Reply]
Done = Callable[[Reply], None]


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _summed(maps: Sequence[Mapping[str, Any]], keep: Mapping[str, Any] | None = None) -> Reply:
    """Every numeric key of `maps` summed; `keep`'s keys as given."""
    total: dict[str, Any] = {}
    for values in maps:
        for key, value in values.items():
            if _number(value):
                total[key] = total.get(key, 0) + value
    total.update(keep or {})
    return total


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def merge_node_stats(local: Reply, peers: list[Reply]) -> Reply:
    """Stats of every node: counts and rates summed, this node's uptime."""
    stats = [_map(r.get("stats")) for r in (local, *peers)]
    mine = stats[0]
    merged = _summed(stats, {"uptime": mine.get("uptime", 0)})
    for rate in ("pushPerSec", "pullPerSec"):
        if _number(merged.get(rate)):
            merged[rate] = round(merged[rate], 2)
    return {"ok": True, "stats": merged}


def merge_node_queues(local: Reply, peers: list[Reply]) -> Reply:
    """ListQueues of every node: the sorted union of their queue names."""
    names: set[str] = set()
    for reply in (local, *peers):
        names.update(q for q in reply.get("queues") or () if isinstance(q, str))
    return {"ok": True, "queues": sorted(names)}


def merge_node_metrics(local: Reply, peers: list[Reply]) -> Reply:
    """The legacy Metrics of every node: counters and memory summed, latency histograms summed
    and the averages read from them (as one front end computes its own), bunqueue's two
    constant zeros kept; `shards` (per-shard lists: requests in flight, jobs in memory, cold
    jobs) this node's."""
    replies = (local, *peers)
    metrics = _summed([_map(r.get("metrics")) for r in replies])
    latency: dict[str, Any] = {}
    for kind in ("push", "pull", "ack"):
        merged = sum_histograms([_map(r.get("latency")).get(kind) for r in replies])
        if merged is not None:
            latency[kind] = merged
    push, pull = histogram_mean(latency.get("push")), histogram_mean(latency.get("pull"))
    metrics.update(
        avgLatencyMs=round((push + pull) / 2, 2),
        avgProcessingMs=round(histogram_mean(latency.get("ack")), 2),
        sqliteSizeMb=0,
        activeConnections=0,
    )
    return {"ok": True, "metrics": metrics, "latency": latency, "shards": local.get("shards")}


def merge_node_workers(local: Reply, peers: list[Reply]) -> Reply:
    """ListWorkers of every node: their workers one after the other, the stats summed."""
    data = [_map(r.get("data")) for r in (local, *peers)]
    workers = [w for d in data for w in d.get("workers") or ()]
    stats = _summed([_map(d.get("stats")) for d in data])
    return {"ok": True, "data": {"workers": workers, "stats": stats}}


class NodeAnswers:
    """Asks this node and its peers, merges their replies, names the nodes that did not
    answer (and logs when one stops or starts answering again)."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._silent: set[str] = set()  # nodes that last failed to answer (for the log)

    def over_shards(
        self,
        client: Client,
        frame: dict[str, Any],
        merge_shards: Callable[[list[Reply]], Reply],
        merge_nodes: MergeNodes,
        done: Done,
    ) -> None:
        """`frame` to this node's shards and every peer; `done` gets the merged reply. With
        `local: true` (or on a peer's link, or on one machine) this node's shards only."""
        if frame.get(LOCAL) is True or self._router.peer_gather is None:
            self._router.gather(client, frame, lambda replies: done(merge_shards(replies)))
            return

        def nodes_done(replies: list[Reply]) -> None:
            done(self._merged(frame, replies, merge_nodes))

        self._router.gather_nodes(client, frame, merge_shards, nodes_done)

    def over_peers(
        self,
        client: Client,
        frame: dict[str, Any],
        here: Callable[[Done], None],
        merge_nodes: MergeNodes,
        done: Done,
    ) -> None:
        """`here(cb)` answers for this node (its shards asked some other way, or a registry
        of the front end's own); `frame` goes to every peer meanwhile."""
        peer_gather = self._router.peer_gather
        if frame.get(LOCAL) is True or peer_gather is None:
            here(done)
            return
        local: list[Reply] = []
        peers: list[list[Reply]] = []

        def settle() -> None:
            if local and peers:
                done(self._merged(frame, [local[0], *peers[0]], merge_nodes))

        def here_done(reply: Reply) -> None:
            local.append(reply)
            settle()

        def peers_done(replies: list[Reply]) -> None:
            peers.append(replies)
            settle()

        if not peer_gather(client, dict(frame), peers_done):
            peers.append([])
        here(here_done)

    def _merged(self, frame: Mapping[str, Any], replies: list[Reply], merge: MergeNodes) -> Reply:
        local, peers = replies[0], replies[1:]
        if local.get("ok") is not True:
            return local  # this node's own failure (a restarting shard), as on one machine
        answered = [r for r in peers if r.get("ok") is True]
        missing = sorted({str(r.get(NODE_FIELD, "?")) for r in peers if r.get("ok") is not True})
        self._note(frame, peers)
        reply = merge(local, answered)
        if missing:
            reply[UNREACHABLE] = missing
        return reply

    def _note(self, frame: Mapping[str, Any], peers: list[Reply]) -> None:
        """Log a node that stops answering, and again when it answers once more."""
        for reply in peers:
            node = str(reply.get(NODE_FIELD, "?"))
            if reply.get("ok") is True:
                if node in self._silent:
                    self._silent.discard(node)
                    _log.info("node answers cluster-wide commands again", node=node)
            elif node not in self._silent and len(self._silent) < _MAX_REMEMBERED:
                self._silent.add(node)
                _log.warning("node left out of a cluster-wide answer", node=node,
                             command=frame.get("cmd"), error=reply.get("error"))  # fmt: skip
