"""`AsyncZmqTransport`: one `zmq.asyncio` DEALER, the asyncio twin of `SyncZmqTransport`;
the shared deadlines and reply handling are `shardq.client._async_transport`'s. Only an asyncio
`zmq://` connection imports it (and ZeroMQ)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import zmq
import zmq.asyncio

from shardq.client._async_transport import Deadlines, Futures, Reply, resolve_reply
from shardq.client._core import ClientCore, Framing, fail_waiters
from shardq.client._errors import ConnectionLost
from shardq.client._url import ClientSecurity, Endpoint
from shardq.client._zmq_sockets import (
    MONITOR_EVENTS,
    close_monitored,
    dealer_event,
    monitor_event,
    monitor_socket,
    new_dealer,
)

__all__ = ["AsyncZmqTransport"]


class AsyncZmqTransport:
    """One `zmq.asyncio` DEALER with a reader task and a monitor task.

    Sends use NOBLOCK: with `IMMEDIATE`, `Again` means there is no connection to queue on.
    """

    releases_on_close = False  # the server's ROUTER sees no close; leases lapse by TTL

    def __init__(
        self, endpoint: Endpoint, context: zmq.asyncio.Context | None, security: ClientSecurity
    ) -> None:
        ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._endpoint = endpoint
        self._sock: zmq.asyncio.Socket = new_dealer(ctx, security)
        self._shadow: zmq.Socket[bytes] = zmq.Socket.shadow(self._sock.underlying)
        self._monitor = monitor_socket(self._sock, MONITOR_EVENTS)
        self._core: ClientCore[asyncio.Future[Reply]] = ClientCore(Framing.MESSAGE)
        self._deadlines = Deadlines(self._core)
        loop = self._loop = asyncio.get_running_loop()
        self._connected: asyncio.Future[None] = loop.create_future()
        self._dead: str | None = None
        self._closed = False
        self._sock.connect(endpoint.zmq_address)
        self._tasks = [
            loop.create_task(self._read_loop(), name=f"shardq-zmq-read-{endpoint.port}"),
            loop.create_task(self._watch(), name=f"shardq-zmq-monitor-{endpoint.port}"),
        ]

    @classmethod
    async def open(
        cls,
        endpoint: Endpoint,
        connect_timeout: float,
        context: zmq.asyncio.Context | None,
        security: ClientSecurity,
    ) -> AsyncZmqTransport:
        self = cls(endpoint, context, security)
        try:
            async with asyncio.timeout(connect_timeout):
                await asyncio.shield(self._connected)
        except TimeoutError:
            self._dead = f"no handshake with {endpoint} within {connect_timeout:g} s"
        if self._dead is not None:
            reason = self._dead
            await self.close()
            raise ConnectionLost(f"cannot connect to {endpoint}: {reason}", sent=False)
        return self

    @property
    def alive(self) -> bool:
        return self._dead is None

    @property
    def writable(self) -> bool:
        return True  # SNDHWM 0: ZeroMQ queues without limit; the command timeout bounds it

    def submit(
        self, commands: Sequence[Mapping[str, Any]], timeout: float
    ) -> tuple[list[str], Futures]:
        if self._dead is not None:
            raise ConnectionLost(self._dead, sent=False)
        loop = self._loop
        futures: Futures = [loop.create_future() for _ in commands]
        rids, bodies = self._core.prepare(commands, futures)
        for sent, body in enumerate(bodies):
            if not self._send_now(body):
                fail_waiters(
                    self._core.take(rids), f"not connected to {self._endpoint}", sent=sent > 0
                )
                return rids, futures
        self._deadlines.arm(loop, rids, timeout, commands[0].get("cmd"))
        return rids, futures

    async def drained(self) -> None:
        return None

    def _send_now(self, body: bytes) -> bool:
        """Send without blocking; False if there is no connection to queue on."""
        # The asyncio socket's own NOBLOCK send (a finished future) also re-checks the
        # edge-triggered ZMQ_FD for the pending recv, which a send through a shadow socket
        # would not: a reply could then sit unread until the next message arrives.
        outcome = cast("asyncio.Future[Any]", self._sock.send(body, zmq.NOBLOCK))
        return not (outcome.done() and outcome.exception() is not None)

    def forget(self, rids: Sequence[str]) -> None:
        self._core.forget(rids)

    def listen(self, on_push: Callable[[Reply], None]) -> None:
        self._core.on_push = on_push

    async def close(self) -> None:
        """Close the socket; requests still waiting fail with `ConnectionLost`."""
        self._die("the connection was closed by the client")
        if self._closed:
            return
        self._closed = True
        current = asyncio.current_task()
        others = [t for t in self._tasks if t is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        close_monitored(self._sock, self._monitor)

    async def _read_loop(self) -> None:
        try:
            while True:
                self._receive(await self._sock.recv())
                self._drain()
        except zmq.ZMQError as e:
            self._die(f"ZeroMQ error on {self._endpoint}: {e}")

    def _drain(self) -> None:
        """Take what else is queued without a future per message."""
        while True:
            try:
                body = self._shadow.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._receive(body)

    def _receive(self, body: bytes) -> None:
        matched = self._core.receive(body)
        if matched is not None:
            resolve_reply(*matched)

    async def _watch(self) -> None:
        try:
            while True:
                event = monitor_event(await self._monitor.recv_multipart())
                self._on_event(event)
        except zmq.ZMQError as e:
            self._die(f"ZeroMQ monitor error on {self._endpoint}: {e}")

    def _on_event(self, event: int) -> None:
        handshaken, dead = dealer_event(event, self._connected.done(), self._endpoint)
        if dead is not None:
            self._die(dead)  # ends the connect attempt too
        elif handshaken and not self._connected.done():
            self._connected.set_result(None)

    def _die(self, reason: str) -> None:
        if self._dead is not None:
            return
        self._dead = reason
        if not self._connected.done():
            self._connected.set_result(None)
        self._deadlines.cancel()
        fail_waiters(self._core.fail_all(), reason)
