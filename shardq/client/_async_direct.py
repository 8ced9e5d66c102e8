"""`AsyncDirectRoutes`: the direct path (`shardq.client._direct`) for an `AsyncConnection`,
single pushes straight to the shard that owns their queue over asyncio connections."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardq.client._async_transport import AsyncTcpTransport, wait_replies_async
from shardq.client._direct import PROBE, DirectLost, Routes, refused
from shardq.client._errors import CommandTimeout, ConnectionLost
from shardq.client._url import ClientSecurity, Endpoint

__all__ = ["AsyncDirectRoutes"]

Reply = dict[str, Any]


class AsyncDirectRoutes(Routes):
    """The asyncio connections to the shards' direct ports, opened on first use."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float) -> None:
        super().__init__(endpoint, connect_timeout)
        self._open: dict[int, AsyncTcpTransport] = {}

    async def call(self, queue: str, command: Mapping[str, Any], timeout: float) -> Reply | None:
        """Push on the direct path; None when it goes through the front end instead.
        Raises what `DirectRoutes.call` raises."""
        found = self._address(queue)
        if found is None:
            return None
        shard, address = found
        transport = self._open.get(shard)
        if transport is None or not transport.alive:
            if transport is not None:  # closed by the shard: idle, restarted or gone
                del self._open[shard]
                await transport.close()
                if transport.ended:  # a stopping shard: its port is going away
                    self._rest()
                    return None
            opened = await self._connect(address)
            if opened is None:
                return None
            transport = self._open.get(shard)
            if transport is not None and transport.alive:  # another task opened it meanwhile
                await opened.close()
            else:
                transport = self._open[shard] = opened
        try:
            reply = (await wait_replies_async(transport, [command], timeout))[0]
        except ConnectionLost as e:
            await self._drop(shard, transport)
            if e.sent:
                raise DirectLost(str(e), sent=True) from e
            return None
        if refused(reply):
            self._rest()
            return None
        self._answered()
        return reply

    async def _connect(self, address: Endpoint) -> AsyncTcpTransport | None:
        """A new connection to a direct port that answered the probe, or None (then the
        direct path rests)."""
        try:
            opened = await AsyncTcpTransport.open(address, self._connect_timeout, ClientSecurity())
        except ConnectionLost:
            self._unreached(address)
            return None
        try:
            await wait_replies_async(opened, [PROBE], self._connect_timeout)
        except (ConnectionLost, CommandTimeout):
            await opened.close()
            self._rest()
            return None
        return opened

    async def _drop(self, shard: int, transport: AsyncTcpTransport) -> None:
        if self._open.get(shard) is transport:
            del self._open[shard]
        self._rest()
        await transport.close()

    async def close(self) -> None:
        open_, self._open = self._open, {}
        self._addresses = []
        for transport in open_.values():
            await transport.close()
