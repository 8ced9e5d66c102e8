"""asyncio transports: one TCP or ZeroMQ connection, used from one event loop.

Thin adapters around a `ClientCore`: `submit` sends commands at once (no await, so commands
leave in the order they were submitted) and returns one future per reply; replies resolve them
as they arrive (any order); a broken connection fails every waiting future with
`ConnectionLost`. A transport lives for one connection; its owner opens a new one after a
loss. TCP uses an `asyncio.Protocol` (no reader task) and writes everything submitted in one
loop iteration with one `write`; ZeroMQ (`shardq.client._async_zmq`, imported for a `zmq://`
connection alone) uses `zmq.asyncio` with a socket monitor, as the blocking `SyncZmqTransport`
does.

Deadlines are not one `asyncio.timeout` per request: requests whose deadlines fall in the same
`DEADLINE_GRAIN` share one timer, which fails those still unanswered with `CommandTimeout`
(a deadline may pass up to one grain late).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from shardq.client._core import ClientCore, Framing, fail_waiters, no_reply
from shardq.client._errors import ConnectionLost
from shardq.client._sockets import connect_tcp_async
from shardq.client._url import ClientSecurity, Endpoint, closed_message

__all__ = [
    "DEADLINE_GRAIN",
    "AsyncTcpTransport",
    "AsyncTransport",
    "Deadlines",
    "resolve_reply",
    "wait_replies_async",
]

Reply = dict[str, Any]
Futures = list["asyncio.Future[Reply]"]
DEADLINE_GRAIN: Final = 0.05  # seconds: requests whose deadlines are this close share a timer
# What is read, at most, of a connection whose write failed (`AsyncTcpTransport._read_left`).
_LEFT_READS: Final = 16


class AsyncTransport(Protocol):
    """What the asyncio `AsyncConnection` needs from a transport."""

    releases_on_close: bool

    @property
    def alive(self) -> bool: ...

    @property
    def writable(self) -> bool:
        """False while the peer reads slower than we write (await `drained` before more)."""
        ...

    def submit(
        self, commands: Sequence[Mapping[str, Any]], timeout: float
    ) -> tuple[list[str], Futures]:
        """Send `commands` now; return their request ids and one future per reply. A future
        still unanswered after `timeout` seconds fails with `CommandTimeout`.

        Raises:
            ConnectionLost: the connection is gone (`sent=False`: nothing was written).
            SerializationError: a command cannot be encoded (nothing was sent).
        """
        ...

    async def drained(self) -> None:
        """Return once the transport is writable again."""
        ...

    def listen(self, on_push: Callable[[Reply], None]) -> None:
        """Call `on_push` with each frame the server sends unasked (`ClientCore.on_push`)."""
        ...

    def forget(self, rids: Sequence[str]) -> None: ...

    async def close(self) -> None: ...


async def wait_replies_async(
    transport: AsyncTransport,
    commands: Sequence[Mapping[str, Any]],
    timeout: float,
) -> list[Reply]:
    """Send `commands` and return their replies in order, all within `timeout` seconds.

    Raises:
        CommandTimeout: some reply did not come in time (the rest are given up on too).
        ConnectionLost: the connection broke first.
        SerializationError: a command cannot be encoded.
    """
    if not commands:
        return []
    rids, futures = transport.submit(commands, timeout)
    try:
        if not transport.writable:
            await _drained(transport, commands, timeout)
        if len(futures) == 1:
            return [await futures[0]]
        return [await future for future in futures]
    finally:
        transport.forget(rids)  # a no-op for answered requests


async def _drained(
    transport: AsyncTransport, commands: Sequence[Mapping[str, Any]], timeout: float
) -> None:
    try:
        async with asyncio.timeout(timeout):
            await transport.drained()
    except TimeoutError:
        raise no_reply(commands[0].get("cmd"), timeout) from None


def resolve_reply(future: asyncio.Future[Reply], reply: Reply) -> None:
    if not future.done():
        future.set_result(reply)


class Deadlines:
    """Fails the requests of one core that are not answered in time, with one timer per
    (grain, timeout, command name) instead of one per request."""

    def __init__(self, core: ClientCore[asyncio.Future[Reply]]) -> None:
        self._core = core
        self._buckets: dict[tuple[int, float, object], list[str]] = {}
        self._timers: dict[tuple[int, float, object], asyncio.TimerHandle] = {}

    def arm(
        self, loop: asyncio.AbstractEventLoop, rids: list[str], timeout: float, name: object
    ) -> None:
        tick = math.ceil((loop.time() + timeout) / DEADLINE_GRAIN)
        key = (tick, timeout, name)
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = list(rids)
            self._timers[key] = loop.call_at(tick * DEADLINE_GRAIN, self._fire, key)
        else:
            bucket.extend(rids)

    def _fire(self, key: tuple[int, float, object]) -> None:
        self._timers.pop(key, None)
        rids = self._buckets.pop(key, None)
        if not rids:
            return
        waiting = self._core.take(rids)
        if waiting:
            error = no_reply(key[2], key[1])
            for future in waiting:
                if not future.done():
                    future.set_exception(error)

    def cancel(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._buckets.clear()


class AsyncTcpTransport(asyncio.Protocol):
    """One TCP connection; `data_received` feeds the core directly.

    What is submitted during one loop iteration goes out in one `write` at its end (a cork):
    100 pipelined requests cost one system call, not 100.
    """

    releases_on_close = True

    def __init__(self, endpoint: Endpoint, loop: asyncio.AbstractEventLoop) -> None:
        self._endpoint = endpoint
        self._loop = loop
        self._core: ClientCore[asyncio.Future[Reply]] = ClientCore(Framing.STREAM)
        self._deadlines = Deadlines(self._core)
        self._transport: asyncio.Transport | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._dead: str | None = None
        self._out: list[bytes] = []
        self._out_rids: list[list[str]] = []
        self._answered = False  # any bytes from the server yet (for the TLS hint)
        self._fd: int | None = None  # the plain socket's descriptor (`_read_left`)

    @classmethod
    async def open(
        cls, endpoint: Endpoint, connect_timeout: float, security: ClientSecurity
    ) -> AsyncTcpTransport:
        loop = asyncio.get_running_loop()
        self = cls(endpoint, loop)
        try:
            async with asyncio.timeout(connect_timeout):
                await connect_tcp_async(endpoint, security, lambda: self)
        except (OSError, TimeoutError) as e:
            raise ConnectionLost(f"cannot connect to {endpoint}: {e!r}", sent=False) from e
        return self

    @property
    def alive(self) -> bool:
        return self._dead is None

    @property
    def ended(self) -> bool:
        """`SyncTcpTransport.ended`: the server said goodbye; nothing failed was applied."""
        return self._core.ended

    @property
    def writable(self) -> bool:
        return self._writable.is_set()

    def submit(
        self, commands: Sequence[Mapping[str, Any]], timeout: float
    ) -> tuple[list[str], Futures]:
        if self._dead is not None or self._transport is None:
            raise ConnectionLost(self._dead or "not connected", sent=False)
        loop = self._loop
        futures: Futures = [loop.create_future() for _ in commands]
        rids, payloads = self._core.prepare(commands, futures)
        if not self._out:
            loop.call_soon(self._flush)
        self._out.append(payloads[0])
        self._out_rids.append(rids)
        self._deadlines.arm(loop, rids, timeout, commands[0].get("cmd"))
        return rids, futures

    def _flush(self) -> None:
        out, self._out = self._out, []
        self._out_rids = []
        if self._dead is None and self._transport is not None and out:
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    async def drained(self) -> None:
        await self._writable.wait()

    def forget(self, rids: Sequence[str]) -> None:
        self._core.forget(rids)

    def listen(self, on_push: Callable[[Reply], None]) -> None:
        self._core.on_push = on_push

    async def close(self) -> None:
        """Close the connection; requests still waiting fail with `ConnectionLost`."""
        self._die("the connection was closed by the client")

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if transport.get_extra_info("sslcontext") is None:
                self._fd = sock.fileno()

    def data_received(self, data: bytes) -> None:
        self._answered = True
        for future, reply in self._core.feed(data):
            if not future.done():
                future.set_result(reply)
        if self._core.broken is not None:
            self._die(f"the server at {self._endpoint} sent a bad frame: {self._core.broken}")
        elif self._core.ended:  # nothing still waiting was taken: safe to send elsewhere
            self._die(f"the server at {self._endpoint} ended the connection", sent=False)

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, (BrokenPipeError, ConnectionResetError)):
            self._read_left()
        if exc is None:
            self._die(closed_message(self._endpoint, self._answered))
        else:
            self._die(f"connection to {self._endpoint} lost: {exc}")

    def _read_left(self) -> None:
        """A write failed because the server closed the connection. Whether it said goodbye
        first (a stopping shard's direct port: nothing unanswered was taken) is in what is
        left to read, which asyncio drops: read it here (the socket closes after this call)."""
        for _ in range(_LEFT_READS):
            if self._fd is None or self._dead is not None:
                return
            try:
                data = os.read(self._fd, 1 << 16)
            except OSError:
                return
            if not data:
                return
            self.data_received(data)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _die(self, reason: str, *, sent: bool = True) -> None:
        if self._dead is not None:
            return
        self._dead = reason
        self._writable.set()
        # Requests still in the cork never left: the caller may safely send them again.
        unsent = [future for rids in self._out_rids for future in self._core.take(rids)]
        self._out, self._out_rids = [], []
        fail_waiters(unsent, reason, sent=False)
        if self._transport is not None:
            self._transport.abort()
        self._deadlines.cancel()
        fail_waiters(self._core.fail_all(), reason, sent=sent)
