"""A shard's direct port: single pushes from shardq's client, without the front end's hop.

One request through the front end is four process wake-ups (client -> front end -> shard ->
front end -> client); straight to the shard it is two. With `direct_shards` on, each shard
listens on an ephemeral TCP port on the front end's `host`, speaking the same frames as the
TCP port (u32 length + msgpack, `reqId` echoed), and tells the front end its port over the
link (`{"t": "direct"}`), which announces all of them in its Hello reply. The listener and its
connections are plain non-blocking sockets in the shard's own `zmq.Poller`: a ZeroMQ ROUTER
would add libzmq's I/O thread, two more wake-ups per request, the very cost this removes.

What the front end does for a PUSH, and what happens to it here:

- frame limits and decoding: the same `FrameDecoder`, bounded by `max_frame_bytes`, the same
  error strings (`Invalid command format`, `Frame too large: ...` and the connection closed);
- `cmd` checked (`Invalid command`), `reqId` echoed verbatim;
- the schema and the engine's checks: in the engine, on the shard already, so a bad PUSH gets
  the same error as through the front end;
- auth tokens, TLS, the rate limit, the partition guard of a cluster: all front-end state.
  The port is not opened with any of them set (`why_not_open`), and the front end announces
  no port in a cluster;
- the in-flight cap (`max_in_flight_per_connection`): past it a connection is read no further
  until its replies bring it back to half; the idle close (`tcp_idle_close_ms`): a connection
  with no partial frame and nothing in flight that sends nothing that long is closed;
- flows (`parentId`, `childrenIds`: the front end checks the parents on other shards) and
  every command but PUSH: refused with `direct_refused(...)`, applied nowhere: the client sends
  them through the front end;
- a PUSH for a queue another shard owns: refused likewise (a client with a stale shard count);
- the Metrics counters and the job cache (id -> shard) of the front end: not fed. Stats counts
  the direct requests (`directRequests`), the pushes answered ok (`directPushed`, which the
  front end adds to Metrics' `totalPushed`), their rate (`directPushPerSec`, added to
  `pushPerSec`) and their latency histogram (`directLatency`, which Metrics sums with its
  own, `runtime._latency`); an id-only command for a job pushed here is found by asking
  every shard, as for an id the cache forgot;
- job events: the shard's own event tap sees the push, as any other;
- durable pushes: answered after the writer's commit, through the same held replies.

Requests enter the shard as one `req` message per turn with negative rids (the front end's
are positive), so `ShardCore` handles them as any other; `take` pulls their replies out of the
turn's `rep` batch before it goes to the front end.

At a stop (SIGTERM, a recycle) the port ends its connections cleanly, in two steps the shard
drives (`ShardProcess._finish`):

- `quiesce()`: the listener closes and no connection is read any further. Whole frames are
  only ever taken together, at the end of a read, so the port stops at a frame boundary; the
  bytes of a frame begun are dropped, never applied;
- `release(conn)`, for each connection once it waits for no reply (at once, or when `take`
  writes its last one: a durable push after its commit): its last frame is
  `direct_goodbye()`, then FIN (`shutdown(SHUT_WR)`) once its replies are written; the socket
  is closed when the client closes its side or has acknowledged every byte (`settled`), so
  that the close never resets a connection whose goodbye is still on its way. A request the
  client had no reply to before the goodbye was not taken: the client sends it again
  through the front end, with no duplicate.

A connection the front end handed over (`shard._handoff`) gets no goodbye: once its replies
are written it goes back to the front end, which serves it on.

`abandon()` closes, without a goodbye, the connections still waiting for a commit the writer
did not confirm in time (their clients cannot know: `ConnectionLost(sent=True)`), and the
shard waits at most `direct_stop_ms` for the rest to settle.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog
import zmq

from shardq.errors import ProtocolError
from shardq.protocol import check_command, encode_js, error_reply
from shardq.protocol._direct import direct_refused, flow_entries, names_flow, shard_of
from shardq.runtime import _messages as msgs
from shardq.runtime._latency import Latency
from shardq.runtime._rates import RateWindow
from shardq.runtime._sections import TcpSettings
from shardq.runtime.shard._direct_conn import Conn as _Conn
from shardq.runtime.shard._direct_stop import READ_BYTES, DirectStop
from shardq.runtime.shard._direct_work import WORK, HandedWork
from shardq.runtime.shard._handoff import HandedConns, HandedDecoder

__all__ = ["DIRECT_CONN_PREFIX", "DirectPort", "why_not_open"]

DIRECT_CONN_PREFIX: Final = "direct:"
# How often connections with a deadline (no whole frame yet, or a partial one) are checked.
SWEEP_EVERY_S: Final = 1.0
# At most one warning per this many seconds about connections refused at the cap.
_WARN_EVERY_S: Final = 1.0
# While ending connections, how often the shard looks whether their last bytes were taken.
SETTLE_EVERY_MS: Final = 5

# The poll flags as plain ints: pyzmq's are `enum.IntFlag` members, and `events & zmq.POLLIN`
# on one builds a new flag in Python (about 0.5 µs; two on every read of this port, `serve`).
_POLLIN: Final = int(zmq.POLLIN)
_POLLOUT: Final = int(zmq.POLLOUT)
# A flow's parts are checked against other shards by the front end.

_log = structlog.get_logger()


def why_not_open(tcp: TcpSettings, *, external_store: bool) -> str:
    """Why a shard must not open its direct port ("" if it may): a check of the front end's
    that the port would get around."""
    if tcp.auth_tokens or tcp.tls_cert_file:
        return "auth_tokens or TLS are set"
    if tcp.rate_limit_window_ms:
        return "a rate limit is set"
    if external_store:  # several nodes may share it: the front end's partition guard
        return "the store is PostgreSQL (a cluster)"
    return ""


class DirectPort(DirectStop, HandedConns, HandedWork):
    """The listener and connections of one shard's direct port, polled by the shard's loop."""

    def __init__(
        self,
        host: str,
        index: int,
        shards: int,
        poller: zmq.Poller,
        *,
        max_connections: int,
        max_frame_bytes: int,
        max_write_bytes: int,
        handshake_s: float = 0.0,
        frame_s: float = 0.0,
        idle_close_s: float = 0.0,
        max_in_flight: int = 1 << 62,
        rate_window_s: int = 5,
    ) -> None:
        """Listen on an ephemeral port of `host`. Raises `OSError` if it cannot be bound.

        As on the TCP port, a connection must send a whole first frame within `handshake_s`
        and finish each later frame within `frame_s` of reading its first bytes, and is closed
        when it has nothing in flight and sent nothing for `idle_close_s` (0: no bound); it is
        read no further while `max_in_flight` of its requests wait for their replies.
        `rate_window_s`: the window of the push rate `stats` gives (`stats_rate_window_s`).
        """
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family, backlog=128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._index = index
        self._shards = shards
        self._poller = poller
        self._max_connections = max_connections
        self._max_frame = max_frame_bytes
        self._max_write = max_write_bytes or (1 << 62)  # 0: unbounded, as on the TCP port
        self._handshake_s = handshake_s
        self._frame_s = frame_s
        self._idle_s = idle_close_s
        self._max_in_flight = max_in_flight
        self._timed: set[_Conn] = set()  # connections with a deadline
        self._next_sweep = 0.0
        self._warned_at = 0.0
        self._conns: dict[int, _Conn] = {}
        self._by_name: dict[str, _Conn] = {}
        self._names = itertools.count(1)
        self._rids = itertools.count(-1, -1)
        self.inflight: dict[int, str] = {}  # rid -> conn name, until the reply is taken
        self._req_ids: dict[int, object] = {}  # rid -> the client's reqId
        self.served = 0  # requests taken to the engine (Stats' directRequests)
        # When each request in flight arrived (`perf_counter`, read once a `serve`), for the
        # latency histograms of what this port answers ok (Stats' directLatency).
        self._arrived: dict[int, float] = {}
        self._now = 0.0
        self.push_ms = Latency()
        self.pushed = 0  # pushes answered ok (directPushed)
        self._rates = RateWindow(rate_window_s, width=2)  # pushes, and pulls (`HandedWork`)
        self._work_init()
        # Handed-off connections (`shard._handoff`): where they go back, and where their end
        # is told; set by the shard process when `tcp_handoff` is on.
        self.on_handback: Callable[[socket.socket, str, bytes], bool] | None = None
        self.on_gone: Callable[[str], None] | None = None
        self._adopted: list[_Conn] = []  # taken, their bytes not looked at yet
        self.handed_off = 0  # connections taken from the front end (Stats' handedOff)
        self.handed_back = 0  # and given back to it (handedBack)
        self.quiesced = False  # stopping: nothing is read or accepted any more (`quiesce`)
        self._shut: set[_Conn] = set()  # FIN sent, not closed yet
        self.released = 0  # connections ended with a goodbye
        poller.register(self._listener.fileno(), zmq.POLLIN)

    @property
    def connections(self) -> int:
        """The client connections open on this port now."""
        return len(self._conns)

    def stats(self) -> dict[str, Any]:
        """This port's counts for the shard's Stats (summed over shards by the front end),
        and the latency histograms of what it answered (`directLatency`, which `Metrics`
        adds to the front end's own)."""
        self._mark()
        return {
            "directRequests": self.served,
            "directPushed": self.pushed,
            "directPushPerSec": self._rates.per_second()[0],
            "directPulled": self.pulled,
            "directCompleted": self.completed,
            "directPullPerSec": self._rates.per_second()[1],
            "handedOff": self.handed_off,
            "handedBack": self.handed_back,
            "directLatency": {
                "push": self.push_ms.histogram(),
                "pull": self.pull_ms.histogram(),
                "ack": self.ack_ms.histogram(),
            },
        }

    def _mark(self) -> None:
        second = int(time.monotonic())
        if second != self._rates.second:
            self._rates.advance(second, (self.pushed, self.pulled))

    def announcement(self) -> msgs.DirectMsg:
        """The message telling the front end this port."""
        return msgs.direct(self._index, self.port)

    # -- input -------------------------------------------------------------------------------

    def serve(self, ready: Mapping[Any, int]) -> list[list[Any]]:
        """Accept and read what `ready` (the poll's result) says; return the request items
        `[conn, rid, command]` for the engine. Writes pending replies on POLLOUT."""
        items: list[list[Any]] = []
        self._now = time.perf_counter()
        if self._adopted:
            adopted, self._adopted = self._adopted, []
            for taken in adopted:
                if self._by_name.get(taken.name) is taken:
                    self._got(taken, b"", items)
        conns = self._conns
        for fd, events in ready.items():
            conn = conns.get(fd)
            if conn is not None:
                if events & _POLLOUT:
                    self._flush(conn)
                if events & _POLLIN and fd in conns:
                    if conn.shut:
                        self._discard(conn)
                    elif not self.quiesced:
                        self._read(conn, items)
            elif fd == self._listener.fileno():
                self._accept()
        if self._timed:
            self._sweep(time.monotonic())
        if self._shut:
            self._settle()
        return items

    def poll_timeout(self, timeout_ms: int | None) -> int | None:
        """`timeout_ms`, or less so that the loop wakes for the next sweep of deadlines (or,
        while connections end, to see whether they settled)."""
        if self._shut:
            return SETTLE_EVERY_MS if timeout_ms is None else min(timeout_ms, SETTLE_EVERY_MS)
        if not self._timed:
            return timeout_ms
        left = max(int((self._next_sweep - time.monotonic()) * 1000) + 1, 0)
        return left if timeout_ms is None else min(timeout_ms, left)

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY_S
        for conn in [c for c in self._timed if c.deadline is not None and c.deadline <= now]:
            if conn.idle:
                _log.info("direct connection closed: idle", conn=conn.name)
            else:
                _log.info("direct connection closed: no whole frame in time", conn=conn.name)
            self._drop(conn)

    def _deadline(self, conn: _Conn, seconds: float, *, idle: bool = False) -> None:
        if seconds > 0:
            conn.idle = idle
            conn.deadline = time.monotonic() + seconds
            if not self._timed:
                self._next_sweep = time.monotonic() + SWEEP_EVERY_S
            self._timed.add(conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors: the client falls back
                _log.warning("direct port cannot accept", error=str(e))
                return
            if len(self._conns) >= self._max_connections:
                now = time.monotonic()
                if now - self._warned_at >= _WARN_EVERY_S:
                    self._warned_at = now
                    _log.warning("direct port at its connection cap", cap=self._max_connections)
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(
                sock, f"{DIRECT_CONN_PREFIX}{self._index}:{next(self._names)}", self._max_frame
            )
            self._conns[sock.fileno()] = conn
            self._by_name[conn.name] = conn
            self._poller.register(sock.fileno(), zmq.POLLIN)
            self._deadline(conn, self._handshake_s)

    def _make_conn(self, sock: socket.socket, name: str) -> _Conn:
        return _Conn(sock, name, self._max_frame)

    def _read(self, conn: _Conn, items: list[list[Any]]) -> None:
        try:
            data = conn.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data:
            self._drop(conn)
            return
        self._got(conn, data, items)

    def _got(self, conn: _Conn, data: bytes, items: list[list[Any]]) -> None:
        replies: list[dict[str, Any]] = []
        decoder = conn.decoder
        frames = decoder.feed(data)
        if type(decoder) is HandedDecoder:
            if self._handed_frames(conn, decoder, frames, items):
                return  # on its way back: no deadline, no cap of ours applies
        else:
            for frame in frames:
                self._take(conn, frame, items, replies)
        if frames or conn.deadline is None or conn.idle:
            # A frame ended (or one began): what is left of the next one has `frame_s`.
            conn.deadline = None
            self._timed.discard(conn)
            if conn.decoder.buffered:
                self._deadline(conn, self._frame_s)
            else:
                self._idle(conn)
        if replies:
            self._write(conn, b"".join(encode_js(r) for r in replies))
        if conn.inflight >= self._max_in_flight and not conn.paused and not conn.closing:
            conn.paused = True  # back-pressure, as on the TCP port: never an error
            self._watch(conn)

    def _idle(self, conn: _Conn) -> None:
        """Start the idle close's clock if `conn` waits for nothing either way."""
        if conn.inflight == 0 and conn.deadline is None and not conn.decoder.buffered:
            self._deadline(conn, self._idle_s, idle=True)

    def _watch(self, conn: _Conn) -> None:
        """Poll `conn` for what it needs now: input unless paused, output while `out` waits."""
        returning = type(conn.decoder) is HandedDecoder and conn.decoder.returning
        reading = not conn.paused and not returning
        events = (_POLLIN if reading else 0) | (_POLLOUT if conn.out else 0)
        fd = conn.sock.fileno()
        if events:
            self._poller.register(fd, events)  # registering again modifies
        else:
            with contextlib.suppress(KeyError):
                self._poller.unregister(fd)

    def _take(
        self,
        conn: _Conn,
        frame: dict[str, Any] | ProtocolError,
        items: list[list[Any]],
        replies: list[dict[str, Any]] | None,
    ) -> bool:
        """One decoded frame: a request for the engine, or an answer at once; without
        `replies` (a handed-off connection) False for any frame not taken to the engine."""
        if replies is None:
            name = _served_name(frame)
            if name is None or isinstance(frame, ProtocolError):
                return False
            if name in WORK:
                if not self._serves_work(name, frame):
                    return False
                self._work_to_engine(conn, name, frame, items)
                return True
            if self._refusal(name, frame, bulk=True) is not None:
                return False
            self._to_engine(conn, frame, items)
            return True
        if isinstance(frame, ProtocolError):
            replies.append(error_reply(str(frame), frame.req_id))
            if frame.fatal:
                conn.closing = True
            return True
        try:
            name = check_command(frame)
        except ProtocolError as e:
            req = frame.get("reqId")
            replies.append(error_reply(str(e), req if isinstance(req, str) else None))
            return True
        refusal = self._refusal(name, frame)
        if refusal is not None:
            reply = error_reply(direct_refused(refusal))
            if "reqId" in frame:
                reply["reqId"] = frame["reqId"]
            replies.append(reply)
            return True
        self._to_engine(conn, frame, items)
        return True

    def _to_engine(self, conn: _Conn, frame: dict[str, Any], items: list[list[Any]]) -> int:
        """Take `frame` to the engine (this turn's `items`); its rid."""
        rid = next(self._rids)
        if "reqId" in frame:
            self._req_ids[rid] = frame.pop("reqId")
        self.inflight[rid] = conn.name
        self._arrived[rid] = self._now
        conn.inflight += 1
        self.served += 1
        items.append([conn.name, rid, frame])
        return rid

    def _refusal(self, name: str, frame: Mapping[str, Any], *, bulk: bool = False) -> str | None:
        """Why this port does not serve `frame` (None: it does). `bulk`: a PUSHB with no flow
        entry is served too (a handed-off connection, `shard._handoff`)."""
        if name == "PUSHB" and bulk:
            if flow_entries(frame):
                return "a flow's PUSHB goes through the front end"
        elif name != "PUSH":
            return f"{name} goes through the front end"
        elif names_flow(frame):
            return "a flow's PUSH goes through the front end"
        queue = frame.get("queue")
        # A queue that is not a string gets the engine's own error, as through the front end.
        if isinstance(queue, str) and shard_of(queue, self._shards) != self._index:
            return f"queue {queue!r} is on shard {shard_of(queue, self._shards)}"
        return None

    # -- output ------------------------------------------------------------------------------

    def take(self, msg: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Send this port's replies out of a `rep` batch; return the rest of the batch for the
        front end, or None if nothing is left of it."""
        inflight = self.inflight
        rest: list[Any] = []
        out: dict[str, list[dict[str, Any]]] = {}
        pushed = 0
        now = time.perf_counter()
        for item in msg["items"]:
            rid = item[1]
            name = inflight.pop(rid, None) if type(rid) is int and rid < 0 else None
            if name is None:
                rest.append(item)
                continue
            reply = item[2]
            ms = (now - self._arrived.pop(rid, now)) * 1000.0
            if self._work and rid in self._work:
                self._work_done(rid, reply, ms)  # a pull or ack (handed-off connections)
            elif reply.get("ok") is True:
                ids = reply.get("ids")  # a PUSHB's (handed-off connections)
                pushed += len(ids) if type(ids) is list else 1
                self.push_ms.add(ms)
            req = self._req_ids.pop(rid, None)
            if req is not None:
                reply["reqId"] = req
            out.setdefault(name, []).append(reply)
        if pushed:
            self._mark()  # before counting: these replies belong to this second
            self.pushed += pushed
        for name, replies in out.items():
            conn = self._by_name.get(name)
            if conn is not None:  # else gone: the reply goes nowhere, as for a closed TCP peer
                conn.inflight -= len(replies)
                if not self.quiesced:
                    if conn.paused and conn.inflight <= self._max_in_flight // 2:
                        conn.paused = False
                        self._watch(conn)
                    self._idle(conn)
                # One reply (a client waiting on each) needs no join.
                one = len(replies) == 1
                encode = self._encode
                data = encode(replies[0]) if one else b"".join(map(encode, replies))
                self._write(conn, data)
                self._return_if_done(conn)
                if self.quiesced and conn.inflight == 0:
                    self.release(conn)  # its last reply is out: the goodbye follows
        if not rest:
            return None
        return msgs.rep(rest)

    def _write(self, conn: _Conn, data: bytes) -> None:
        if conn.out:
            conn.out += data
        else:
            try:
                sent = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._drop(conn)
                return
            if sent < len(data):
                conn.out += memoryview(data)[sent:]
                self._watch(conn)
        if len(conn.out) > self._max_write:
            _log.warning("direct connection dropped: it does not read its replies",
                         conn=conn.name, unread=len(conn.out))  # fmt: skip
            self._drop(conn)
        elif not conn.out:
            if conn.closing:
                self._drop(conn)
            elif conn.ending and not conn.shut:
                self._shut_down(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        del conn.out[:sent]
        if not conn.out:
            if conn.closing:
                self._drop(conn)
            elif conn.ending and not conn.shut:
                self._shut_down(conn)
            else:
                self._watch(conn)
                self._return_if_done(conn)

    def _drop(self, conn: _Conn) -> None:
        if self._forget(conn):
            conn.sock.close()
            if type(conn.decoder) is HandedDecoder and self.on_gone is not None:
                self.on_gone(conn.name)

    def _forget(self, conn: _Conn) -> bool:
        """Stop tracking and polling `conn`; False if it was gone already."""
        fd = conn.sock.fileno()
        if self._conns.pop(fd, None) is None:
            return False
        self._by_name.pop(conn.name, None)
        self._timed.discard(conn)
        self._shut.discard(conn)
        with contextlib.suppress(KeyError, zmq.ZMQError):
            self._poller.unregister(fd)
        return True

    def close(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        if not self.quiesced:
            with contextlib.suppress(KeyError, zmq.ZMQError):
                self._poller.unregister(self._listener.fileno())
        self._listener.close()


def _served_name(frame: dict[str, Any] | ProtocolError) -> str | None:
    """The command a well-formed frame names; None for one the front end must answer."""
    if isinstance(frame, ProtocolError):
        return None
    try:
        return check_command(frame)
    except ProtocolError:
        return None
