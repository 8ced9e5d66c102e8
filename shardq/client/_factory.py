"""`Transports`: the one factory of a connection's links to its server, blocking and asyncio.

A connection is made with its configuration resolved (`Endpoint`, `ClientSecurity`, connect
timeout; see `shardq.client._url`) and keeps one `Transports` built from it. Everything the
connection opens comes from there, with the same TLS context and CURVE key:

- `open_sync` / `open_async`: a command transport (request ids, pipelining, reply matching);
- `open_events` / `open_events_async`: the same connection in event mode, a subscription
  link that sends its hello (`Auth`, `SubscribeEvents`) and then reads the frames the server
  pushes (events without a `reqId`); `shardq.client._events` runs the subscription over it.

An event link waits for the first frame the server sends instead of a reply to a request, so
it carries no `ClientCore`: what its frames mean is `_events._Feed`'s (sans-IO) business.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import msgpack  # type: ignore[import-untyped]
import zmq
import zmq.asyncio

from shardq.client._async_transport import AsyncTcpTransport, AsyncTransport, AsyncZmqTransport
from shardq.client._errors import ConnectionLost
from shardq.client._sockets import connect_tcp, new_dealer, open_tcp_stream
from shardq.client._sync_transport import SyncTcpTransport, SyncTransport
from shardq.client._sync_zmq import SyncZmqTransport
from shardq.client._url import ClientSecurity, Endpoint
from shardq.protocol import FrameDecoder, encode_many

__all__ = ["AsyncEventLink", "EventLink", "Transports"]

Frame = dict[str, Any]
_EVENT_READ_BYTES: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class Transports:
    """Opens a connection's command transports and event links (see the module docstring)."""

    endpoint: Endpoint
    security: ClientSecurity
    connect_timeout: float

    def open_sync(self, zmq_context: zmq.Context[Any] | None = None) -> SyncTransport:
        """A blocking command transport. Raises `ConnectionLost(sent=False)` if the server
        cannot be reached (or its handshake fails) within the connect timeout."""
        if self.endpoint.scheme == "tcp":
            return SyncTcpTransport(self.endpoint, self.connect_timeout, self.security)
        return SyncZmqTransport(self.endpoint, self.connect_timeout, zmq_context, self.security)

    async def open_async(self, zmq_context: zmq.asyncio.Context | None = None) -> AsyncTransport:
        """An asyncio command transport. Raises what `open_sync` raises."""
        endpoint, timeout, security = self.endpoint, self.connect_timeout, self.security
        if endpoint.scheme == "tcp":
            return await AsyncTcpTransport.open(endpoint, timeout, security)
        return await AsyncZmqTransport.open(endpoint, timeout, zmq_context, security)

    def open_events(self, hello: Sequence[Frame]) -> EventLink:
        """A blocking event link that has sent `hello`. Raises OSError or ZMQError."""
        if self.endpoint.scheme == "zmq":
            # Not IMMEDIATE: the hello waits in the pipe for the handshake instead of failing.
            dealer = new_dealer(zmq.Context.instance(), self.security, immediate=False)
            dealer.connect(self.endpoint.zmq_address)
            link: EventLink = _ZmqEventLink(dealer)
        else:
            link = _TcpEventLink(
                self.endpoint, connect_tcp(self.endpoint, self.connect_timeout, self.security)
            )
        link.send(hello)
        return link

    async def open_events_async(self, hello: Sequence[Frame]) -> AsyncEventLink:
        """An asyncio event link that has sent `hello`. Raises OSError, ZMQError or
        TimeoutError (no TCP connection within the connect timeout)."""
        if self.endpoint.scheme == "zmq":
            ctx = zmq.asyncio.Context.instance()
            dealer = new_dealer(ctx, self.security, immediate=False)
            dealer.connect(self.endpoint.zmq_address)
            link: AsyncEventLink = _AsyncZmqEventLink(dealer)
        else:
            reader, writer = await asyncio.wait_for(
                open_tcp_stream(self.endpoint, self.security), self.connect_timeout
            )
            link = _AsyncTcpEventLink(self.endpoint, reader, writer)
        await link.send(hello)
        return link


def _unpack(body: bytes) -> object:
    return msgpack.unpackb(body, raw=False)


def _pack(frame: Frame) -> bytes:
    data: bytes = msgpack.packb(frame, use_bin_type=True)
    return data


def _closed(endpoint: Endpoint) -> ConnectionLost:
    return ConnectionLost(f"the server at {endpoint} closed the event connection")


class EventLink(Protocol):
    """A blocking event link: `send` frames, `read` the frames that come within a timeout."""

    def send(self, frames: Sequence[Frame]) -> None: ...

    def read(self, timeout: float) -> list[object]:
        """The frames that arrived within `timeout` s (maybe none). Raises `ConnectionLost`
        when the server closed the link, OSError or ZMQError when it broke."""
        ...

    def close(self) -> None: ...


class _TcpEventLink(EventLink):
    def __init__(self, endpoint: Endpoint, sock: socket.socket) -> None:
        self._endpoint = endpoint
        self._sock = sock
        self._decoder = FrameDecoder()

    def send(self, frames: Sequence[Frame]) -> None:
        self._sock.sendall(encode_many(list(frames)))

    def read(self, timeout: float) -> list[object]:
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(_EVENT_READ_BYTES)
        except TimeoutError:
            return []
        if not data:
            raise _closed(self._endpoint)
        return list(self._decoder.feed(data))

    def close(self) -> None:
        self._sock.close()


class _ZmqEventLink(EventLink):
    def __init__(self, dealer: zmq.Socket[Any]) -> None:
        self._dealer = dealer

    def send(self, frames: Sequence[Frame]) -> None:
        for frame in frames:
            self._dealer.send(_pack(frame))

    def read(self, timeout: float) -> list[object]:
        if self._dealer.poll(int(timeout * 1000)):
            return [_unpack(self._dealer.recv_multipart()[-1])]
        return []

    def close(self) -> None:
        self._dealer.close(linger=0)


class AsyncEventLink(Protocol):
    """The asyncio twin of `EventLink`."""

    async def send(self, frames: Sequence[Frame]) -> None: ...

    async def read(self, timeout: float) -> list[object]:
        """As `EventLink.read`."""
        ...

    def close(self) -> None: ...


class _AsyncTcpEventLink(AsyncEventLink):
    def __init__(
        self, endpoint: Endpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._endpoint = endpoint
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder()

    async def send(self, frames: Sequence[Frame]) -> None:
        self._writer.write(encode_many(list(frames)))

    async def read(self, timeout: float) -> list[object]:
        try:
            data = await asyncio.wait_for(self._reader.read(_EVENT_READ_BYTES), timeout)
        except TimeoutError:
            return []
        if not data:
            raise _closed(self._endpoint)
        return list(self._decoder.feed(data))

    def close(self) -> None:
        self._writer.close()


class _AsyncZmqEventLink(AsyncEventLink):
    def __init__(self, dealer: zmq.asyncio.Socket) -> None:
        self._dealer = dealer

    async def send(self, frames: Sequence[Frame]) -> None:
        for frame in frames:
            await self._dealer.send_multipart([_pack(frame)])

    async def read(self, timeout: float) -> list[object]:
        if await self._dealer.poll(int(timeout * 1000)):
            return [_unpack((await self._dealer.recv_multipart())[-1])]
        return []

    def close(self) -> None:
        self._dealer.close(linger=0)
