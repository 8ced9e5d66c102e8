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

What a `tcp://` or `tls://` link needs is imported here; ZeroMQ (`_sync_zmq`, `_async_zmq`,
`_zmq_links`) and asyncio (`_async_transport`) are imported by the methods that open such a
link, so a blocking TCP client loads neither, an asyncio one no ZeroMQ
(tests/test_import_boundary.py).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from shardq.client._errors import ConnectionLost
from shardq.client._sockets import connect_tcp, open_tcp_stream
from shardq.client._sync_transport import SyncTcpTransport, SyncTransport
from shardq.client._url import ClientSecurity, Endpoint
from shardq.protocol import FrameDecoder, encode_many

if TYPE_CHECKING:
    import asyncio

    import zmq
    import zmq.asyncio

    from shardq.client._async_transport import AsyncTransport

__all__ = ["AsyncEventLink", "EventLink", "Transports", "closed_link"]

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
        from shardq.client._sync_zmq import SyncZmqTransport

        return SyncZmqTransport(self.endpoint, self.connect_timeout, zmq_context, self.security)

    async def open_async(self, zmq_context: zmq.asyncio.Context | None = None) -> AsyncTransport:
        """An asyncio command transport. Raises what `open_sync` raises."""
        from shardq.client._async_transport import AsyncTcpTransport

        endpoint, timeout, security = self.endpoint, self.connect_timeout, self.security
        if endpoint.scheme == "tcp":
            return await AsyncTcpTransport.open(endpoint, timeout, security)
        from shardq.client._async_zmq import AsyncZmqTransport

        return await AsyncZmqTransport.open(endpoint, timeout, zmq_context, security)

    def open_events(self, hello: Sequence[Frame]) -> EventLink:
        """A blocking event link that has sent `hello`. Raises OSError, or ConnectionLost
        (a ZeroMQ error)."""
        if self.endpoint.scheme == "zmq":
            from shardq.client._zmq_links import open_zmq_link

            return open_zmq_link(self.endpoint, self.security, hello)
        sock = connect_tcp(self.endpoint, self.connect_timeout, self.security)
        link = _TcpEventLink(self.endpoint, sock)
        link.send(hello)
        return link

    async def open_events_async(self, hello: Sequence[Frame]) -> AsyncEventLink:
        """An asyncio event link that has sent `hello`. Raises OSError, ConnectionLost (a
        ZeroMQ error) or TimeoutError (no TCP connection within the connect timeout)."""
        import asyncio

        if self.endpoint.scheme == "zmq":
            from shardq.client._zmq_links import open_zmq_link_async

            return await open_zmq_link_async(self.endpoint, self.security, hello)
        reader, writer = await asyncio.wait_for(
            open_tcp_stream(self.endpoint, self.security), self.connect_timeout
        )
        link = _AsyncTcpEventLink(self.endpoint, reader, writer)
        await link.send(hello)
        return link


def closed_link(endpoint: Endpoint) -> ConnectionLost:
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
            raise closed_link(self._endpoint)
        return list(self._decoder.feed(data))

    def close(self) -> None:
        self._sock.close()


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
        import asyncio  # loaded: this runs in an event loop

        try:
            data = await asyncio.wait_for(self._reader.read(_EVENT_READ_BYTES), timeout)
        except TimeoutError:
            return []
        if not data:
            raise closed_link(self._endpoint)
        return list(self._decoder.feed(data))

    def close(self) -> None:
        self._writer.close()
