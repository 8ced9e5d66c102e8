"""Connections that go to the node holding a queue: `ClusterConnection` here, its asyncio twin
`AsyncClusterConnection` in `shardq.client._async_cluster`.

Several shardq nodes on one PostgreSQL database (docs/cluster.md) split the queues by
partition. Any node answers any command (it forwards what another node holds), at the cost of
one more round trip; these connections save it. They open the URL given (the seed node, TCP
or ZeroMQ), ask it `ClusterStatus` once for the partition count, and send `NoForward` on
every connection they open, so a node answers `MOVED <partition> <host:port>` for a queue it
does not hold instead of forwarding it. On `MOVED` the connection remembers that partition's
node, sends the command there once more, and sends that partition's later commands there
directly. A command naming no queue goes to the seed node (which looks a job id up on the
other nodes itself).

Bounded: the map holds at most one address per partition (the partition count is the
database's), and at most `MAX_NODES` connections to other nodes are kept (the oldest closed
past that). Other nodes are reached on their advertised TCP address (`tcp://`, or `tls://`
when the seed URL is `tls://`), with the seed's token, timeouts, retry policy and TLS
settings. A server that does not answer `ClusterStatus` (bunqueue, an older shardq) is used
as a plain connection.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Final

from shardq.client._connection import Command, Connection, Reply, check_all
from shardq.protocol._partitions import partition_of

__all__ = [
    "MAX_NODES",
    "NO_FORWARD",
    "STATUS",
    "ClusterConnection",
    "ClusterMap",
    "by_target",
    "node_url",
]

MAX_NODES: Final = 64
NO_FORWARD: Final = {"cmd": "NoForward"}
STATUS: Final = {"cmd": "ClusterStatus"}


class ClusterMap:
    """Which node a command goes to (sans-IO): the partitions learned from `MOVED`."""

    def __init__(self) -> None:
        self.partitions = 0  # 0: not a cluster (or not asked yet): everything to the seed
        self.owners: dict[int, str] = {}  # partition -> "host:port"; at most `partitions`
        self.direct = 0  # commands sent straight to a node other than the seed
        self.redirects = 0  # MOVED answers followed

    def target(self, command: Command) -> str | None:
        """The address `command` goes to, or None for the seed."""
        queue = command.get("queue")
        if self.partitions and isinstance(queue, str):
            return self.owners.get(partition_of(queue, self.partitions))
        return None

    def learn(self, reply: Reply) -> bool:
        """Take a `MOVED <partition> <host:port>` reply; True if it was one."""
        error = reply.get("error") if reply.get("ok") is False else None
        if not isinstance(error, str) or not error.startswith("MOVED "):
            return False
        parts = error.split(" ")
        if len(parts) != 3 or not parts[1].isdigit():
            return False
        partition = int(parts[1])
        if 0 <= partition < self.partitions:
            self.owners[partition] = parts[2]
            self.redirects += 1
            return True
        return False

    def status(self, reply: Reply) -> bool:
        """Take `ClusterStatus`' reply; True if the server is a shardq node."""
        count = reply.get("partitions")
        if reply.get("ok") is True and isinstance(count, int) and count > 0:
            self.partitions = count
            return True
        return False


def by_target(targets: Sequence[str | None]) -> dict[str | None, list[int]]:
    groups: dict[str | None, list[int]] = {}
    for i, target in enumerate(targets):
        groups.setdefault(target, []).append(i)
    return groups


def node_url(tls: bool, address: str) -> str:
    """Another node's TCP port (`MOVED` names it), with TLS when the seed URL had it."""
    return f"{'tls' if tls else 'tcp'}://{address}"


class ClusterConnection(Connection):
    """A `Connection` that follows `MOVED` (see the module docstring); same arguments."""

    def __init__(self, url: str = "tcp://127.0.0.1:6789", **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._kwargs = {k: v for k, v in kwargs.items() if k != "zmq_context"}
        self.map = ClusterMap()
        self._asked = False
        self._nodes: dict[str, Connection] = {}
        self._nodes_lock = threading.Lock()

    def call_many(
        self,
        commands: Sequence[Command],
        *,
        timeout: float | None = None,
        wait: float = 0.0,
        idempotent: bool = True,
        check: bool = True,
    ) -> list[Reply]:
        if not self._asked:
            self._ask_status()
        options = {"timeout": timeout, "wait": wait, "idempotent": idempotent}
        replies = self._send(commands, [self.map.target(c) for c in commands], options)
        again = [i for i, reply in enumerate(replies) if self.map.learn(reply)]
        if again:
            redo = [commands[i] for i in again]
            for i, reply in zip(again, self._send(redo, [self.map.target(c) for c in redo],
                                                  options), strict=True):  # fmt: skip
                replies[i] = reply
        return check_all(replies, check)

    def _ask_status(self) -> None:
        self._asked = True
        status = super().call_many([STATUS], check=False)[0]
        if self.map.status(status):
            self.hello = [NO_FORWARD]  # sent again on every reconnect
            super().call_many([NO_FORWARD])

    def _send(
        self, commands: Sequence[Command], targets: list[str | None], options: dict[str, Any]
    ) -> list[Reply]:
        replies: list[Reply] = [{}] * len(commands)
        for target, indices in by_target(targets).items():
            part = [commands[i] for i in indices]
            if target is None:
                got = super().call_many(part, check=False, **options)
            else:
                self.map.direct += len(part)
                got = self._node(target).call_many(part, check=False, **options)
            for i, reply in zip(indices, got, strict=True):
                replies[i] = reply
        return replies

    def _node(self, address: str) -> Connection:
        with self._nodes_lock:  # threads share the connection: one per node all the same
            node = self._nodes.get(address)
            if node is None:
                if len(self._nodes) >= MAX_NODES:
                    self._nodes.pop(next(iter(self._nodes))).close()
                url = node_url(self.endpoint.tls, address)
                node = self._nodes[address] = Connection(url, **self._kwargs)
                node.hello = [NO_FORWARD]
            return node

    def close(self) -> None:
        super().close()
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            node.close()
