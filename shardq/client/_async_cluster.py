"""`AsyncClusterConnection`: the asyncio twin of `shardq.client._cluster.ClusterConnection`,
an `AsyncConnection` that follows `MOVED` to the node holding a queue (docs/cluster.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardq.client._async_connection import AsyncConnection
from shardq.client._cluster import MAX_NODES, NO_FORWARD, STATUS, ClusterMap, by_target, node_url
from shardq.client._connection import Command, Reply, check_all

__all__ = ["AsyncClusterConnection"]


class AsyncClusterConnection(AsyncConnection):
    """An `AsyncConnection` that follows `MOVED` (see the module docstring)."""

    def __init__(self, url: str = "tcp://127.0.0.1:6789", **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._kwargs = {k: v for k, v in kwargs.items() if k != "zmq_context"}
        self.map = ClusterMap()
        self._asked = False
        self._nodes: dict[str, AsyncConnection] = {}

    async def call_many(
        self,
        commands: Sequence[Command],
        *,
        timeout: float | None = None,
        wait: float = 0.0,
        idempotent: bool = True,
        check: bool = True,
    ) -> list[Reply]:
        if not self._asked:
            await self._ask_status()
        options = {"timeout": timeout, "wait": wait, "idempotent": idempotent}
        replies = await self._send(commands, [self.map.target(c) for c in commands], options)
        again = [i for i, reply in enumerate(replies) if self.map.learn(reply)]
        if again:
            redo = [commands[i] for i in again]
            targets = [self.map.target(c) for c in redo]
            for i, reply in zip(again, await self._send(redo, targets, options), strict=True):
                replies[i] = reply
        return check_all(replies, check)

    async def _ask_status(self) -> None:
        self._asked = True
        status = (await super().call_many([STATUS], check=False))[0]
        if self.map.status(status):
            self.hello = [NO_FORWARD]
            await super().call_many([NO_FORWARD])

    async def _send(
        self, commands: Sequence[Command], targets: list[str | None], options: dict[str, Any]
    ) -> list[Reply]:
        replies: list[Reply] = [{}] * len(commands)
        for target, indices in by_target(targets).items():
            part = [commands[i] for i in indices]
            if target is None:
                got = await super().call_many(part, check=False, **options)
            else:
                self.map.direct += len(part)
                got = await (await self._node(target)).call_many(part, check=False, **options)
            for i, reply in zip(indices, got, strict=True):
                replies[i] = reply
        return replies

    async def _node(self, address: str) -> AsyncConnection:
        node = self._nodes.get(address)
        if node is None:
            if len(self._nodes) >= MAX_NODES:
                await self._nodes.pop(next(iter(self._nodes))).close()
            url = node_url(self.endpoint.tls, address)
            node = self._nodes[address] = AsyncConnection(url, **self._kwargs)
            node.hello = [NO_FORWARD]
        return node

    async def close(self) -> None:
        await super().close()
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.close()
