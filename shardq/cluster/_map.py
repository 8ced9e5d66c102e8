"""The cluster map a node publishes in its run directory, and what its processes make of it.

The writer's lease thread (the only one that talks leases with PostgreSQL) writes
`<run dir>/cluster.json` after each round, as the writer's status file is written (a temporary
file renamed over the old one, so a reader never sees half of it):

    {"node": id, "address": "host:port", "partitions": N,
     "valid_until": <CLOCK_MONOTONIC seconds>, "held": [partition, ...],
     "epochs": [epoch of each held partition, in the same order],
     "nodes": [{"id", "address", "alive", "partitions"}], "owners": {"<partition>": id},
     "renew_ms": <the lease round's duration>}

`valid_until` is the monotonic time (one clock for every process of a machine) until which
this node may serve `held`: the start of the round that renewed them plus most of a lease, so
a node frozen past its lease (SIGSTOP, a long pause) refuses at once when it wakes, before its
lease thread has even run. The front end reads the file (`PartitionGuard`) and refuses a
command for a queue of a partition it does not hold with `MOVED <partition> <address>`, which
it forwards to that address unless the connection asked for `MOVED`
(`shardq.runtime.frontend._forward`, to the other live nodes, `PartitionGuard.peers`); the
HTTP process answers `GET /cluster` from it (`cluster_view`) and `/ready`'s share check.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from shardq.protocol._partitions import partition_of

__all__ = [
    "HOLDING_FILE",
    "MAP_FILE",
    "NodeInfo",
    "PartitionGuard",
    "cluster_view",
    "held_pairs",
    "moved_error",
    "read_holding",
    "read_map",
    "single_node_view",
    "write_holding",
    "write_map",
]

MAP_FILE: Final = "cluster.json"
# The partitions some shard still holds in memory (or has mutations of not yet committed):
# written by the front end from the shards' `loaded` answers, read by the lease thread before
# it releases a partition it set aside for a rebalance.
HOLDING_FILE: Final = "holding.json"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as `/cluster` shows it."""

    id: str
    address: str
    alive: bool
    partitions: int


_MAX_NAMES: Final = 100_000  # queue -> partition memo; ~100 bytes a name


def write_map(
    run_dir: str,
    *,
    node: str,
    address: str,
    partitions: int,
    valid_until: float,
    held: Mapping[int, int],
    nodes: Sequence[NodeInfo],
    owners: Mapping[int, str],
    renew_ms: float = 0.0,
    listening: bool = True,
) -> None:
    """Replace the map file (atomically). Raises OSError. `renew_ms`: how long the round
    that wrote it took (`/prometheus`); `listening`: whether the round knew this node's TCP
    port to accept connections (before, the node takes no partition)."""
    doc = {
        "node": node,
        "address": address,
        "partitions": partitions,
        "valid_until": valid_until,
        "held": sorted(held),
        "epochs": [held[p] for p in sorted(held)],
        "nodes": [
            {"id": n.id, "address": n.address, "alive": n.alive, "partitions": n.partitions}
            for n in nodes
        ],
        "owners": {str(p): o for p, o in sorted(owners.items())},
        "updated_ms": int(time.time() * 1000),
        "renew_ms": round(renew_ms, 3),
        "listening": listening,
    }
    path = Path(run_dir) / MAP_FILE
    tmp = path.with_name(f".{MAP_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, separators=(",", ":")))
    os.replace(tmp, path)


def write_holding(run_dir: str, parts: frozenset[int]) -> None:
    """Replace the holding file (atomically). Raises OSError."""
    path = Path(run_dir) / HOLDING_FILE
    tmp = path.with_name(f".{HOLDING_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"parts": sorted(parts)}, separators=(",", ":")))
    os.replace(tmp, path)


def read_holding(run_dir: str) -> frozenset[int] | None:
    """The partitions the shards still hold, or None if the file is missing or unreadable."""
    try:
        doc = json.loads((Path(run_dir) / HOLDING_FILE).read_text())
    except (OSError, ValueError):
        return None
    parts = doc.get("parts") if isinstance(doc, dict) else None
    if not isinstance(parts, list):
        return None
    return frozenset(p for p in parts if type(p) is int)


def read_map(run_dir: str) -> dict[str, Any] | None:
    """The map file's contents, or None if there is none (yet) or it cannot be read."""
    try:
        doc = json.loads((Path(run_dir) / MAP_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def held_pairs(doc: Mapping[str, Any]) -> frozenset[tuple[int, int]]:
    """The (partition, epoch) pairs a map says its node holds (malformed entries left out)."""
    held, epochs = doc.get("held", []), doc.get("epochs", [])
    if not isinstance(held, list) or not isinstance(epochs, list) or len(held) != len(epochs):
        return frozenset()
    return frozenset((p, e) for p, e in zip(held, epochs, strict=True)
                     if type(p) is int and type(e) is int)  # fmt: skip


def cluster_view(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`GET /cluster`'s answer from a map file: `{nodes: [...], partitions: N}`."""
    return {"nodes": list(doc.get("nodes", [])), "partitions": doc.get("partitions", 0)}


def single_node_view(node: str, address: str, partitions: int) -> dict[str, Any]:
    """`GET /cluster` of a node alone (SQLite, or PostgreSQL before its first lease round):
    itself, alive, holding every partition."""
    me = {"id": node, "address": address, "alive": True, "partitions": partitions}
    return {"nodes": [me], "partitions": partitions}


def moved_error(partition: int, address: str) -> str:
    """The error a node answers for a queue of a partition another node holds: one line a
    client can split on spaces (`MOVED`, the partition, the holder's `host:port`)."""
    return f"MOVED {partition} {address}"


class PartitionGuard:
    """The front end's view of the map: which queues this node serves now.

    `refresh()` re-reads the file when it changed (the front end calls it on a timer, a
    fraction of the lease); `refusal(queue)` is the per-command check: None to serve, else
    the error to answer. One dict lookup and one clock read per command.
    """

    def __init__(self, run_dir: str, node: str, partitions: int, shards: int = 0) -> None:
        self._path = Path(run_dir) / MAP_FILE
        self._node = node
        self._partitions = partitions
        self._stamp: tuple[int, int] | None = None
        # The partitions whose lease the node holds (the map's `held`) with their epochs
        # (`holdings`), what each shard says it has loaded (`loaded`), and what it serves:
        # leased AND loaded by every shard at the same epoch, so a client never sees a queue
        # half loaded, nor one loaded under an earlier lease that another node has written
        # since (docs/cluster.md). `shards` 0: serve what is leased (no shard reports).
        self.leased: frozenset[int] = frozenset()
        self.holdings: frozenset[tuple[int, int]] = frozenset()
        self._shards = shards
        self._loaded: dict[int, frozenset[tuple[int, int]]] = {}
        self._held: frozenset[int] = frozenset()
        self._valid_until = 0.0
        self._addresses: dict[int, str] = {}
        self._memo: dict[str, int] = {}
        self.peers: tuple[str, ...] = ()  # the other live nodes' addresses (forwarding)
        # Whether the lease thread has seen this node's TCP port accept (it takes partitions
        # only from then on; the front end waits for it before it reports ready).
        self.listening = False

    def refresh(self) -> bool:
        """Read the file again if it changed; True if it did."""
        try:
            st = self._path.stat()
        except OSError:
            return False
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return False
        doc = read_map(str(self._path.parent))
        if doc is None:
            return False
        self._stamp = stamp
        self.load(doc)
        return True

    def load(self, doc: Mapping[str, Any]) -> None:
        """Take a map (as read from the file)."""
        address = {n.get("id"): n.get("address", "") for n in doc.get("nodes", [])}
        owners = doc.get("owners", {})
        self._addresses = {int(p): str(address.get(o) or o) for p, o in owners.items()}
        self.holdings = held_pairs(doc)
        self.leased = frozenset(p for p, _ in self.holdings)
        self._valid_until = float(doc.get("valid_until", 0.0))
        self.listening = doc.get("listening", True) is True
        self.peers = tuple(
            str(n.get("address")) for n in doc.get("nodes", [])
            if n.get("alive") and n.get("id") != self._node and n.get("address")
        )  # fmt: skip
        self._serve()

    def loaded(self, shard: int, held: Sequence[tuple[int, int]]) -> None:
        """Shard `shard` holds these (partition, epoch) in memory now."""
        self._loaded[shard] = frozenset(held)
        self._serve()

    def forget(self, shard: int) -> None:
        """Shard `shard` went away: what it holds is unknown until it reports again."""
        self._loaded.pop(shard, None)
        self._serve()

    def holding(self) -> frozenset[int]:
        """The partitions some shard says it holds (its mutations of them not all committed
        included): the union of their last `loaded` answers."""
        held: set[int] = set()
        for pairs in self._loaded.values():
            held.update(p for p, _ in pairs)
        return frozenset(held)

    def behind(self) -> list[int]:
        """The shards whose holdings differ from the leases (or are unknown)."""
        leased, loaded = self.holdings, self._loaded
        return [i for i in range(self._shards) if loaded.get(i) != leased]

    def _serve(self) -> None:
        held = self.holdings
        for shard in range(self._shards):
            held = held & self._loaded.get(shard, frozenset())
        self._held = frozenset(p for p, _ in held)

    def refusal(self, queue: str) -> str | None:
        """None if this node serves `queue` now; else the error to answer."""
        part = self._memo.get(queue)
        if part is None:
            if len(self._memo) >= _MAX_NAMES:
                self._memo.clear()
            part = self._memo[queue] = partition_of(queue, self._partitions)
        if part in self._held and time.monotonic() < self._valid_until:
            return None
        address = self._addresses.get(part)
        if part not in self.leased and address:
            return moved_error(part, address)
        if part in self.leased and time.monotonic() < self._valid_until:
            return f"Partition unavailable: node {self._node} is loading partition {part}; retry"
        return (
            f"Partition unavailable: node {self._node} does not hold partition {part} now"
            " (its lease is being taken or renewed); retry"
        )
