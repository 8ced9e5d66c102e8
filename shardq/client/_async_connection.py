"""`AsyncConnection`: the asyncio twin of `shardq.client._connection.Connection` (reconnects,
authenticates and retries the same way, shares its settings), for one event loop; and
`Submitted`, the commands `AsyncConnection.submit` wrote."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from shardq.client._async_direct import AsyncDirectRoutes
from shardq.client._async_events import AsyncEventStream
from shardq.client._async_transport import AsyncTransport, wait_replies_async
from shardq.client._connection import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    Command,
    Reply,
    Settings,
    check_all,
)
from shardq.client._direct import HELLO, DirectLost, direct_queue
from shardq.client._errors import ClientClosed, ClientError, CommandTimeout, ConnectionLost
from shardq.client._retry import RetryPolicy
from shardq.client._url import DEFAULT_URL, client_security

if TYPE_CHECKING:  # a `tcp://` connection imports no ZeroMQ
    import ssl

    import zmq.asyncio

__all__ = ["AsyncConnection", "Submitted"]


class AsyncConnection(Settings):
    """The asyncio twin of `Connection`: pipelining, reconnecting, for one event loop."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        retry: RetryPolicy | None = None,
        zmq_context: zmq.asyncio.Context | None = None,
        tls_context: ssl.SSLContext | None = None,
        zmq_server_key: str | None = None,
        tls_ca_file: str | None = None,
        direct: bool = True,
    ) -> None:
        security = client_security(
            zmq_server_key=zmq_server_key, tls_ca_file=tls_ca_file, tls_context=tls_context
        )
        super().__init__(url, token, timeout, connect_timeout, retry, security)
        self._zmq_context = zmq_context
        self._transport: AsyncTransport | None = None
        # Single pushes straight to their shard, when the server offers it (`_direct`).
        self.direct = (
            AsyncDirectRoutes(self.endpoint, connect_timeout)
            if self.direct_wanted(direct)
            else None
        )
        self._lock = asyncio.Lock()
        self._closed = False
        # Frames the server sends unasked on this connection (a worker's cancels).
        self.on_push: Callable[[Reply], None] | None = None

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def live(self) -> bool:
        """True while a transport is open and usable (no reconnect needed for the next call)."""
        transport = self._transport
        return transport is not None and transport.alive and not self._closed

    async def connect(self) -> None:
        """Open the connection now. Raises what `Connection.connect` raises."""
        await self._ensure()

    async def call(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        wait: float = 0.0,
        idempotent: bool = True,
    ) -> Reply:
        """Send one command and return its reply. Raises what `Connection.call` raises."""
        replies = await self.call_many([command], timeout=timeout, wait=wait, idempotent=idempotent)
        return replies[0]

    async def call_many(
        self,
        commands: Sequence[Command],
        *,
        timeout: float | None = None,
        wait: float = 0.0,
        idempotent: bool = True,
        check: bool = True,
    ) -> list[Reply]:
        """Pipeline `commands`; replies in order. Raises what `Connection.call` raises.

        On a live connection the commands are written before this coroutine first yields, so
        commands from one task leave in the order they were called.
        """
        limit = (self.timeout if timeout is None else timeout) + wait
        attempt = 0
        while True:
            try:
                return check_all(await self._attempt(commands, limit), check)
            except ClientError as e:
                if not self.may_retry(e, attempt, idempotent, len(commands)):
                    raise
            await asyncio.sleep(self.retry.delay(attempt))
            attempt += 1

    def submit(
        self, commands: Sequence[Command], *, timeout: float | None = None
    ) -> Submitted | None:
        """Write `commands` now, on the live transport, and return a handle to await their
        replies with; None when there is no live transport (use `call_many`, which connects).

        No retries: the caller decides what a failure means.

        Raises:
            SerializationError: a command cannot be encoded (nothing was sent).
        """
        transport = self._transport
        if transport is None or not transport.alive or self._closed:
            return None
        limit = self.timeout if timeout is None else timeout
        try:
            rids, futures = transport.submit(commands, limit)
        except ConnectionLost:
            return None
        return Submitted(transport, rids, futures)

    def events(self, queue: str | None, *, since: int | None = None) -> AsyncEventStream:
        """This connection in event mode (see `Connection.events`), for asyncio."""
        return AsyncEventStream(
            self.endpoint,
            queue,
            self.token,
            connect_timeout=self.connect_timeout,
            since=since,
            security=self.security,
        )

    async def close(self) -> None:
        """Close the connection; later calls raise `ClientClosed`. Idempotent."""
        self._closed = True
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.close()
        if self.direct is not None:
            await self.direct.close()

    async def _attempt(self, commands: Sequence[Command], timeout: float) -> list[Reply]:
        transport = self._transport
        if transport is None or not transport.alive or self._closed:
            transport = await self._ensure()
        direct = self.direct
        try:
            if direct is not None and (queue := direct_queue(commands)) is not None:
                if direct.due():
                    direct.learn((await wait_replies_async(transport, [HELLO], timeout))[0])
                # A direct connection lost raises from here: the front end's stays open.
                reply = await direct.call(queue, commands[0], timeout)
                if reply is not None:
                    return [reply]
            return await wait_replies_async(transport, commands, timeout)
        except ConnectionLost as e:
            if isinstance(e, DirectLost):
                raise
            await transport.close()
            raise

    async def _learn_direct(self, direct: AsyncDirectRoutes, transport: AsyncTransport) -> None:
        """`Connection._learn_direct`, for asyncio."""
        try:
            hello = (await wait_replies_async(transport, [HELLO], self._ask_s))[0]
        except CommandTimeout:
            hello = {}
        direct.learn(hello)

    async def _ensure(self) -> AsyncTransport:
        async with self._lock:
            if self._closed:
                raise ClientClosed(f"the connection to {self.endpoint} was closed")
            transport = self._transport
            if transport is not None and transport.alive:
                return transport
            if transport is not None:
                await transport.close()
            self._transport = None
            transport = await self.transports.open_async(self._zmq_context)
            try:
                auth = self.auth_commands()
                check_all(await wait_replies_async(transport, auth, self.connect_timeout), True)
                if self.direct is not None:
                    await self._learn_direct(self.direct, transport)
            except BaseException:
                await transport.close()
                raise
            if self.on_push is not None:
                transport.listen(self.on_push)
            self._transport = transport
            self.generation += 1
            return transport


class Submitted:
    """Commands `AsyncConnection.submit` wrote; `await replies()` for their answers."""

    __slots__ = ("_futures", "_rids", "_transport")

    def __init__(
        self, transport: AsyncTransport, rids: list[str], futures: list[asyncio.Future[Reply]]
    ) -> None:
        self._transport = transport
        self._rids = rids
        self._futures = futures

    async def replies(self, *, check: bool = True) -> list[Reply]:
        """The replies in order.

        Raises:
            ServerError: with `check`, the first `ok: false` reply.
            CommandTimeout: some reply did not come in time.
            ConnectionLost: the connection broke first (it is closed; the next call reconnects).
        """
        try:
            replies = [await future for future in self._futures]
        except ConnectionLost:
            await self._transport.close()
            raise
        finally:
            self._transport.forget(self._rids)
        return check_all(replies, check)
