"""The TCP side of the front end: bunqueue framing over an asyncio `Protocol`.

A `Protocol` rather than streams: it decodes every frame of one `recv` in one call and writes
every reply of one loop turn in one `transport.write`, about 4x cheaper per request
(reference/limits.md).

Connections are cut for three kinds of abuse, each logged once:
- an oversize frame: the error frame is written, then the connection is closed (§1.1);
- a partial frame held longer than `tcp_idle_timeout_ms` (slowloris, §1.1);
- more than 64 MiB of replies the peer does not read (bunqueue's write-queue bound).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any, Final, cast

import structlog

from shardq.protocol import FrameDecoder, encode
from shardq.runtime.frontend._dispatch import Dispatcher

__all__ = ["MAX_WRITE_BACKLOG", "TcpConnection", "TcpGateway"]

MAX_WRITE_BACKLOG: Final = 64 * 1024 * 1024  # bunqueue TCP_MAX_WRITE_QUEUE_BYTES default

# Reasons a connection's reading is paused; reading resumes when none is left.
_PAUSED_BY_WRITES: Final = 1
_PAUSED_BY_SHARDS: Final = 2

_log = structlog.get_logger()


class TcpConnection(asyncio.Protocol):
    """One TCP client: a frame decoder in, a per-turn write buffer out."""

    def __init__(self, gateway: TcpGateway, conn: str) -> None:
        self.gateway = gateway
        self.conn = conn
        self.authenticated = not gateway.dispatcher.auth_required
        self.closed = False
        self._loop = gateway.loop
        self._decoder = FrameDecoder(gateway.max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._paused = 0
        self._stall_deadline = 0.0
        self._stall_timer: asyncio.TimerHandle | None = None
        self._peer: Any = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_server always hands a stream protocol an `asyncio.Transport`.
        self._transport = cast(asyncio.Transport, transport)
        self._peer = transport.get_extra_info("peername")
        self.gateway.added(self)

    def data_received(self, data: bytes) -> None:
        for frame in self._decoder.feed(data):
            self.gateway.dispatcher.handle(self, frame)
            if self.closed:
                return
        self._watch_partial_frame()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self.gateway.removed(self)

    def pause_writing(self) -> None:
        # The peer reads slower than we answer: stop taking its requests for a while.
        self.pause_reading(_PAUSED_BY_WRITES)

    def resume_writing(self) -> None:
        self.resume_reading(_PAUSED_BY_WRITES)

    # -- the dispatcher's Client -----------------------------------------------------------

    def send(self, reply: dict[str, Any]) -> None:
        if self.closed:
            return
        self._out.append(encode(reply))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def drop(self, reason: str) -> None:
        """Write what is queued (e.g. the error frame), then close; log why."""
        _log.warning("connection dropped", conn=self.conn, peer=self._peer, reason=reason)
        self.flush()
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    # -- writing ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Write every reply queued this turn in one `transport.write`."""
        self._flush_scheduled = False
        transport = self._transport
        if not self._out or transport is None or transport.is_closing():
            self._out.clear()
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        transport.write(data)
        if transport.get_write_buffer_size() > MAX_WRITE_BACKLOG:
            _log.warning(
                "connection dropped", conn=self.conn, peer=self._peer, reason="write backlog"
            )
            self.closed = True
            transport.abort()

    def pause_reading(self, reason: int) -> None:
        if not self._paused and self._transport is not None and not self.closed:
            self._transport.pause_reading()
        self._paused |= reason

    def resume_reading(self, reason: int) -> None:
        was_paused = bool(self._paused)
        self._paused &= ~reason
        if was_paused and not self._paused and self._transport is not None and not self.closed:
            self._transport.resume_reading()

    def close(self) -> None:
        """Close without any further reply (the front end is stopping)."""
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    # -- slowloris -------------------------------------------------------------------------

    def _watch_partial_frame(self) -> None:
        """Arm (or push back) the stall deadline while part of a frame is buffered.

        One timer per connection is re-armed lazily instead of rescheduled on every read.
        """
        idle = self.gateway.idle_timeout_s
        if not self._decoder.buffered or idle <= 0:
            if self._stall_timer is not None:
                self._stall_timer.cancel()
                self._stall_timer = None
            return
        self._stall_deadline = self._loop.time() + idle
        if self._stall_timer is None:
            self._stall_timer = self._loop.call_later(idle, self._check_stall)

    def _check_stall(self) -> None:
        self._stall_timer = None
        if self.closed or not self._decoder.buffered:
            return
        left = self._stall_deadline - self._loop.time()
        if left > 0:
            self._stall_timer = self._loop.call_later(left, self._check_stall)
            return
        _log.warning(
            "connection dropped", conn=self.conn, peer=self._peer, reason="partial frame timeout"
        )
        self.closed = True
        if self._transport is not None:
            self._transport.abort()


class TcpGateway:
    """Creates and tracks the TCP connections; tells the dispatcher when one closes."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        loop: asyncio.AbstractEventLoop,
        max_frame_bytes: int,
        idle_timeout_ms: int,
    ) -> None:
        self.dispatcher = dispatcher
        self.loop = loop
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout_s = idle_timeout_ms / 1000
        self.connections: dict[str, TcpConnection] = {}
        self._ids = itertools.count(1)
        self._pid = os.getpid()
        self._shards_blocked = False

    def factory(self) -> TcpConnection:
        # The pid makes ids unique across front-end restarts too: a shard still holds the
        # leases of a crashed front end's connections, and a reused id would release them.
        return TcpConnection(self, f"t{self._pid}.{next(self._ids)}")

    def added(self, connection: TcpConnection) -> None:
        self.connections[connection.conn] = connection
        if self._shards_blocked:
            connection.pause_reading(_PAUSED_BY_SHARDS)

    def removed(self, connection: TcpConnection) -> None:
        if self.connections.pop(connection.conn, None) is not None:
            self.dispatcher.connection_closed(connection.conn)

    def shards_blocked(self, blocked: bool) -> None:
        """A shard mailbox is full (or has room again): stop (or resume) reading requests."""
        self._shards_blocked = blocked
        for connection in list(self.connections.values()):
            if blocked:
                connection.pause_reading(_PAUSED_BY_SHARDS)
            else:
                connection.resume_reading(_PAUSED_BY_SHARDS)

    def close_all(self) -> None:
        """Close every connection without telling the shards (their leases stay)."""
        for connection in list(self.connections.values()):
            connection.close()
