"""The TCP side of the front end: bunqueue framing over an asyncio `Protocol`.

A `Protocol` rather than streams: it decodes every frame of one `recv` in one call and writes
every reply of one loop turn in one `transport.write` (`python -m bench.limits` measures the
`Protocol` shape, BENCHMARKS.md section 4).

Every resource a connection can hold is bounded (`TcpLimits`, the "bounds" settings):
- connections: past `max_connections` a new one is closed at once (logged, at most once a
  second);
- requests in flight: past `max_in_flight_per_connection` the connection is read no further
  until replies bring it back to half (back-pressure, never an error); the frames its last
  read completed wait, decoded, until then;
- frames: over `max_frame_bytes`, or `unauthenticated_max_frame_bytes` before a successful
  `Auth` when tokens are set, the error frame is written and the connection closed;
- a new connection must send a whole first frame within `tcp_handshake_timeout_ms` (a peer
  that connects and says nothing, or drips, holds a descriptor no longer); at the connection
  cap a new connection evicts the oldest that has not sent one yet, so silent peers cannot
  keep a real client out; the cap itself stays `reserved_fds` below the descriptor limit;
- a partial frame must be complete within `tcp_idle_timeout_ms` of its first byte (slowloris);
  with `tcp_idle_close_ms`, a connection with no partial frame and nothing in flight that sends
  nothing for that long is closed;
- replies the peer does not read: reading pauses while they back up, and past
  `tcp_max_write_backlog_bytes` the connection is cut;
- with `rate_limit_window_ms`, frames past `rate_limit_max_requests` per window are answered
  "Rate limit exceeded" (bunqueue's limiter).
Each cut is logged once per connection.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

import structlog

from shardq.protocol import FrameDecoder, decode_body, encode_js
from shardq.protocol._prepacked import JS_NUMBERS, WIRE_KEY, prepacked_frame
from shardq.protocol._rawpush import Incoming, decode_or_peek
from shardq.runtime._ports import connection_cap
from shardq.runtime._sections import TcpSettings
from shardq.runtime._spec import ChildSpec
from shardq.runtime.frontend._dispatch import Dispatcher
from shardq.runtime.frontend._handoff import HANDED, NONE, SENT, WANTED, Handoffs
from shardq.runtime.frontend._limits import LogLimiter, RateWindow, rate_refusal

__all__ = ["TcpConnection", "TcpGateway", "TcpLimits"]

# Reasons a connection's reading is paused; reading resumes when none is left.
_PAUSED_BY_WRITES: Final = 1
_PAUSED_BY_SHARDS: Final = 2
_PAUSED_BY_IN_FLIGHT: Final = 4
_PAUSED_BY_HANDOFF: Final = 8  # about to be handed to a shard (`frontend._handoff`)

_log = structlog.get_logger()


_TCP = TcpSettings()  # the defaults, declared once in `_sections.py`


@dataclass(frozen=True, slots=True)
class TcpLimits:
    """The bounds of the TCP side, under the names the gateway uses; `TcpSettings` documents
    each and holds its default."""

    max_frame_bytes: int = _TCP.max_frame_bytes
    stall_timeout_ms: int = _TCP.tcp_idle_timeout_ms  # a partial frame, from its first byte
    idle_close_ms: int = _TCP.tcp_idle_close_ms
    max_connections: int = _TCP.max_connections
    max_in_flight: int = _TCP.max_in_flight_per_connection
    max_write_backlog: int = _TCP.tcp_max_write_backlog_bytes
    unauthenticated_max_frame_bytes: int = _TCP.unauthenticated_max_frame_bytes
    rate_window_ms: int = _TCP.rate_limit_window_ms
    rate_max_requests: int = _TCP.rate_limit_max_requests
    handshake_timeout_ms: int = _TCP.tcp_handshake_timeout_ms
    reserved_fds: int = _TCP.reserved_fds
    zmq_handshake_timeout_ms: int = _TCP.zmq_handshake_timeout_ms

    @classmethod
    def from_spec(cls, spec: ChildSpec) -> TcpLimits:
        return cls(
            max_frame_bytes=spec.tcp.max_frame_bytes,
            stall_timeout_ms=spec.tcp.tcp_idle_timeout_ms,
            idle_close_ms=spec.tcp.tcp_idle_close_ms,
            max_connections=spec.tcp.max_connections,
            max_in_flight=spec.tcp.max_in_flight_per_connection,
            max_write_backlog=spec.tcp.tcp_max_write_backlog_bytes,
            unauthenticated_max_frame_bytes=spec.tcp.unauthenticated_max_frame_bytes,
            rate_window_ms=spec.tcp.rate_limit_window_ms,
            rate_max_requests=spec.tcp.rate_limit_max_requests,
            handshake_timeout_ms=spec.tcp.tcp_handshake_timeout_ms,
            reserved_fds=spec.tcp.reserved_fds,
            zmq_handshake_timeout_ms=spec.tcp.zmq_handshake_timeout_ms,
        )


class TcpConnection(asyncio.Protocol):
    """One TCP client: a frame decoder in, a per-turn write buffer out."""

    wire_mode = JS_NUMBERS  # how a shard packs a reply passed through to it
    internal = False  # the HTTP process's link (set by Auth with the internal token)
    no_forward = 0  # what it asked with `NoForward` (frontend._forward): 0 forwards

    def __init__(self, gateway: TcpGateway, conn: str) -> None:
        self.gateway = gateway
        self.conn = conn
        limits = gateway.limits
        self._limits = limits
        self._authenticated = not gateway.dispatcher.auth_required
        self.closed = False
        self._loop = gateway.loop
        self._decoder = FrameDecoder(
            limits.max_frame_bytes
            if self._authenticated
            else min(limits.max_frame_bytes, limits.unauthenticated_max_frame_bytes)
        )
        # A PUSHB passes to its shard undecoded (`protocol._rawpush`) when the dispatcher may.
        dispatcher = gateway.dispatcher
        self._take: Callable[[memoryview], Incoming] = (
            decode_or_peek if dispatcher.pass_pushb else decode_body
        )
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0  # in `_out`
        # `_out` this large is checked against the write backlog at once (0: never).
        self._backlog_check_at = limits.max_write_backlog or 1 << 62
        self._flush_scheduled = False
        self._paused = 0
        self._in_flight = 0
        self._max_in_flight = limits.max_in_flight
        self._held: list[Incoming] = []  # frames read past the in-flight cap
        self._resume_scheduled = False
        self._rate = (
            RateWindow(limits.rate_window_ms, limits.rate_max_requests)
            if limits.rate_window_ms
            else None
        )
        self._stall_s = limits.stall_timeout_ms / 1000
        self._idle_s = limits.idle_close_ms / 1000
        self._partial_since: float | None = None  # when the partial frame's first byte came
        self._last_seen = 0.0  # when data last came (only kept with `idle_close_ms`)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.peer: Any = None
        self.greeted = False  # a whole frame has come
        self._handshake_s = limits.handshake_timeout_ms / 1000
        self._made_at = 0.0
        # Handing the connection to a shard (`frontend._handoff`): the pushes in a row for
        # one shard, and where the handoff stands.
        self._handoffs = gateway.handoffs
        self.streak = 0
        self.streak_shard = -1
        self.stateful = False  # sent a command that keeps state for it: never handed off
        self.handoff_state = NONE
        self.handoff_not_before = 0.0  # loop time: not handed off again before (a back-off)
        # The shard that handed it back, while only pushes came since (-1: none, or others
        # came), and when a hand-back's back-off may be waived again (`Handoffs._waived`).
        self.handed_back_by = -1
        self.waive_not_before = 0.0
        self.sent_unread = b""  # what went with the descriptor, until the shard takes it
        self._resume_unread: bytes | None = None  # set while a handed-back one reconnects
        self._resume_streak = 0  # its count of requests for its shard, when it resumes
        self.waited = False  # it sent a WaitJob: a long-poll here keeps it here (`Handoffs`)

    @property
    def address(self) -> str:
        """The peer's IP address, which its failed Auths count against."""
        peer = self.peer
        return str(peer[0]) if isinstance(peer, tuple) and peer else ""

    @property
    def authenticated(self) -> bool:
        return self._authenticated

    @authenticated.setter
    def authenticated(self, value: bool) -> None:
        # Past Auth, the small pre-auth frame cap gives way to the full one.
        self._authenticated = value
        if value:
            self._decoder.max_frame_size = self._limits.max_frame_bytes

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_server always hands a stream protocol an `asyncio.Transport`.
        self._transport = cast(asyncio.Transport, transport)
        self.peer = transport.get_extra_info("peername")
        if self._resume_unread is not None:
            self._resumed()
            return
        if not self.gateway.added(self):
            return
        now = self._made_at = self._loop.time()
        if self._handshake_s > 0:
            self._arm(now + self._handshake_s)
        if self._idle_s > 0:
            self._last_seen = now
            self._arm(self._last_seen + self._idle_s)

    def data_received(self, data: bytes) -> None:
        frames = self._decoder.feed_with(data, self._take)
        if frames and not self.greeted:
            self.greeted = True
            self.gateway.greeted(self)
        if self._held or self._in_flight + len(frames) > self._max_in_flight:
            # Past the cap: what this read completed waits here (at most one read's frames)
            # and the socket is read no further until replies bring the count down.
            self._held.extend(frames)
            self._handle_held()
        else:
            self._handle(frames)
        if self.closed:
            return
        if self._decoder.buffered or self._partial_since is not None or self._idle_s:
            self._watch_time(bool(frames))

    def _handle(self, frames: list[Incoming]) -> None:
        # Counted before handling: a command answered here is answered (and uncounted) inside
        # `handle`. Every frame gets exactly one reply.
        if self._handoffs is not None and not self.stateful and not self.handoff_state:
            self._handoffs.note(self, frames)
        self._in_flight += len(frames)
        handle = self.gateway.dispatcher.handle
        rate = self._rate
        for frame in frames:
            if rate is not None and not rate.allow(self._loop.time()):
                self.send(rate_refusal(frame))
            else:
                handle(self, frame)
            if self.closed:
                return

    def _handle_held(self) -> None:
        """Handle held frames while the cap allows; pause reading while any are left."""
        self._resume_scheduled = False
        held = self._held
        room = self._max_in_flight - self._in_flight
        if room > 0 and held and not self.closed:
            batch = held[:room]
            del held[:room]
            self._handle(batch)
        if held:
            self.pause_reading(_PAUSED_BY_IN_FLIGHT)
        else:
            self.resume_reading(_PAUSED_BY_IN_FLIGHT)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handoff_state == HANDED:
            return  # its front-end copy closed: the shard serves it now
        self.closed = True
        self._out.clear()
        self._out_bytes = 0
        self._held.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
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
        self._in_flight -= 1
        held_waits = self._held and not self._resume_scheduled
        if held_waits and self._in_flight <= self._max_in_flight // 2:
            # Not from inside `send`: the dispatcher may be mid-way through a batch.
            self._resume_scheduled = True
            self._loop.call_soon(self._handle_held)
        # bunqueue's JS clients read 64-bit ints as BigInt, so large ints go as floats (a reply
        # packed by the shard already has them so).
        data = prepacked_frame(reply) if WIRE_KEY in reply else encode_js(reply)
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes > self._backlog_check_at:
            # Replies pile up within this turn (large ones): check the bound now, not after
            # encoding every reply of a peer that will be cut anyway.
            self._check_backlog()
            if self.closed:
                return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def push_event(self, msg: dict[str, Any], frames: dict[str, bytes], limit: int) -> bool:
        """Queue a server-initiated event frame (no reply to anything: in flight is
        untouched); False, and nothing queued, while `limit` bytes wait unread for the peer."""
        transport = self._transport
        resuming = transport is None and self._resume_unread is not None
        if self.closed or (transport is None and not resuming) or self.handoff_state == SENT:
            # SENT: the shard may be writing to it already (HANDED: no transport here).
            return False
        buffered = 0 if transport is None else transport.get_write_buffer_size()
        if buffered + self._out_bytes > limit:
            return False
        data = frames.get("tcp")
        if data is None:
            # A copy: encode_js floats large ints in place, and the ZeroMQ frame keeps them.
            data = frames["tcp"] = encode_js(copy.deepcopy(msg))
        self._out.append(data)
        self._out_bytes += len(data)
        if not self._flush_scheduled and not resuming:  # resuming: flushed by `_resumed`
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)
        return True

    def drop(self, reason: str) -> None:
        """Write what is queued (e.g. the error frame), then close; log why."""
        _log.warning("connection dropped", conn=self.conn, peer=self.peer, reason=reason)
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
        self._out_bytes = 0
        transport.write(data)
        self._check_backlog()
        if self.handoff_state == WANTED and self._handoffs is not None and not self.closed:
            self._handoffs.ready(self)

    def _check_backlog(self) -> None:
        transport = self._transport
        backlog = self._limits.max_write_backlog
        if transport is None or not backlog:
            return
        if transport.get_write_buffer_size() + self._out_bytes > backlog:
            self._cut("write backlog")

    # -- handing off to a shard (`frontend._handoff`) ----------------------------------------

    def want_handoff(self) -> None:
        """Read no further: hand the connection off once it is quiet."""
        self.handoff_state = WANTED
        self.pause_reading(_PAUSED_BY_HANDOFF)

    @property
    def busy(self) -> bool:
        """Requests in flight or held, or replies not yet flushed."""
        return bool(self._in_flight or self._held or self._out)

    def quiet_socket(self, max_bytes: int) -> Any:
        """The socket, if nothing is in flight, held or unwritten and at most `max_bytes` of
        a partial frame wait; else None."""
        transport = self._transport
        if (
            transport is None
            or self.closed
            or self.busy
            or transport.get_write_buffer_size()
            or self._decoder.buffered > max_bytes
            or self._decoder.closed
        ):
            return None
        return transport.get_extra_info("socket")

    def take_unread(self) -> bytes:
        """The partial frame's bytes; the decoder starts afresh."""
        unread = self._decoder.pending()
        self._decoder = FrameDecoder(self._decoder.max_frame_size)
        return unread

    def handoff_failed(self, unread: bytes, not_before: float) -> None:
        """Not handed off after all: read on from where it stopped."""
        self.handoff_state = NONE
        self.streak = 0
        self.handoff_not_before = not_before
        if unread:
            self._decoder.feed(unread)  # a partial frame: it completes nothing
        self.resume_reading(_PAUSED_BY_HANDOFF)

    def handed_over(self) -> None:
        """The shard took it: close this copy (close, never shutdown: no FIN)."""
        self.handoff_state = HANDED
        self.sent_unread = b""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    def resume_with(self, unread: bytes, not_before: float, shard: int, streak: int) -> None:
        """Handed back by `shard`: the next `connection_made` resumes it, reading `unread`
        first, its count of requests for `shard` at `streak`."""
        self._resume_unread = unread
        self.handoff_not_before = not_before
        self.handed_back_by = shard
        self._resume_streak = streak
        self.streak_shard = shard

    def _resumed(self) -> None:
        unread, self._resume_unread = self._resume_unread or b"", None
        self.handoff_state = NONE
        self.streak, self._resume_streak = self._resume_streak, 0
        self._paused = 0
        if self.gateway.shards_are_blocked:
            self.pause_reading(_PAUSED_BY_SHARDS)
        if self._idle_s > 0:
            self._last_seen = self._loop.time()
            self._arm(self._last_seen + self._idle_s)
        if unread:
            self.data_received(unread)
        if self._out and not self._flush_scheduled and not self.closed:
            # A cancel pushed while the descriptor was on its way back (`push_event`).
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def lost(self) -> None:
        """Ended while a shard held it: as if it closed here."""
        self.handoff_state = NONE
        self._transport = None
        self.connection_lost(None)

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

    def evict(self) -> None:
        """Abort, quietly: at the cap, for a newer connection (the gateway logs it)."""
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    def _cut(self, reason: str) -> None:
        """Abort the connection at once, dropping what is unsent; log why."""
        _log.warning("connection dropped", conn=self.conn, peer=self.peer, reason=reason)
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    # -- time bounds: slowloris and idle ---------------------------------------------------

    def _watch_time(self, completed: bool) -> None:
        """Note when the current partial frame began, and when data last came.

        A partial frame left after complete ones began in this read; one left by a read that
        completed nothing is the same frame as before, and keeps its first byte's time: a
        peer dripping a byte at a time cannot push its deadline back.
        """
        now = self._loop.time()
        if self._idle_s:
            self._last_seen = now
        if not self._decoder.buffered:
            self._partial_since = None
            return
        if completed or self._partial_since is None:
            self._partial_since = now
            if self._stall_s > 0:
                self._arm(now + self._stall_s)

    def _arm(self, at: float) -> None:
        """Make sure a check runs by `at` (one timer per connection, moved only earlier)."""
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._check_time)

    def _check_time(self) -> None:
        self._timer = None
        if self.closed:
            return
        now = self._loop.time()
        due: list[float] = []
        if not self.greeted and self._handshake_s > 0:
            handshake_at = self._made_at + self._handshake_s
            if handshake_at <= now:
                self._cut("no first frame within tcp_handshake_timeout_ms")
                return
            due.append(handshake_at)
        if self._partial_since is not None and self._stall_s > 0:
            stall_at = self._partial_since + self._stall_s
            if stall_at <= now:
                self._cut("partial frame timeout")
                return
            due.append(stall_at)
        if self._idle_s > 0:
            if self._in_flight > 0 or self._partial_since is not None:
                self._last_seen = now  # waiting on us (a long-poll), or mid-frame: not idle
            idle_at = self._last_seen + self._idle_s
            if idle_at <= now:
                self._cut("idle")
                return
            due.append(idle_at)
        if due:
            self._arm(min(due))


class TcpGateway:
    """Creates and tracks the TCP connections; tells the dispatcher when one closes."""

    def __init__(
        self, dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop, limits: TcpLimits
    ) -> None:
        self.dispatcher = dispatcher
        self.loop = loop
        self.limits = limits
        self.connections: dict[str, TcpConnection] = {}
        # Connections that have not sent a whole frame yet, oldest first: evicted at the cap.
        self._fresh: dict[str, TcpConnection] = {}
        self.max_connections = connection_cap(limits.max_connections, limits.reserved_fds)
        self._ids = itertools.count(1)
        self._pid = os.getpid()
        self.handoffs: Handoffs | None = None  # `tcp_handoff` (set by the process)
        self._shards_blocked = False
        self._refused_log = LogLimiter("connection refused: max_connections reached")
        self._evicted_log = LogLimiter("connection evicted: max_connections reached")

    def factory(self) -> TcpConnection:
        # The pid makes ids unique across front-end restarts too: a shard still holds the
        # leases of a crashed front end's connections, and a reused id would release them.
        return TcpConnection(self, f"t{self._pid}.{next(self._ids)}")

    def added(self, connection: TcpConnection) -> bool:
        """Track a new connection; False (and it is closed) past `max_connections` when no
        connection that has not spoken yet can make room for it."""
        if len(self.connections) >= self.max_connections:
            if self._fresh:
                oldest = next(iter(self._fresh.values()))
                self._evicted_log.log(peer=oldest.peer, max_connections=self.max_connections)
                oldest.evict()
                self.removed(oldest)
            else:
                self._refused_log.log(peer=connection.peer, max_connections=self.max_connections)
                connection.close()
                return False
        self.connections[connection.conn] = connection
        self._fresh[connection.conn] = connection
        if self._shards_blocked:
            connection.pause_reading(_PAUSED_BY_SHARDS)
        return True

    def greeted(self, connection: TcpConnection) -> None:
        self._fresh.pop(connection.conn, None)

    def removed(self, connection: TcpConnection) -> None:
        self._fresh.pop(connection.conn, None)
        if self.connections.pop(connection.conn, None) is not None:
            self.dispatcher.connection_closed(connection.conn)

    @property
    def shards_are_blocked(self) -> bool:
        return self._shards_blocked

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
