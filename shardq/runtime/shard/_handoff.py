"""Connections the front end hands a shard (`tcp_handoff`, docs/runtime.md "Handed-off
connections"): bunqueue-client, which knows nothing of the direct ports, served as if it had
connected to one.

The front end passes the descriptor of a TCP connection whose last requests were all pushes,
pulls and acks for this shard (`_direct_work` serves the pulls and acks), with the bytes it
had read past the last whole frame, over a Unix SOCK_SEQPACKET socket of its own
(`ChildSpec.handoff_path`: one message per `sendmsg`, the descriptor as SCM_RIGHTS). The
shard answers `took` (served from now on by the direct port's code, `DirectPort.adopt`) or
not (the front end resumes it).

Whatever the direct port does not serve (another command, another shard's queue, a frame it
cannot decode) sends the connection back: reading stops at that frame, and once every reply
before it is written the descriptor goes back (`back`) with the unread bytes from that frame
on, which the front end feeds to its own decoder first. A graceful stop (SIGTERM, the idle
recycle) sends every handed connection back the same way after the last batch's replies. A
handed connection that closes or is cut here is reported `gone`, so that the front end
releases what it held for it; with no front end linked (it is restarting), it is remembered
(`tcp_handoff_gone_max`) and reported to the next one that connects.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
from collections.abc import Callable
from typing import Any, Final, Protocol

import structlog
import zmq

from shardq.errors import ProtocolError
from shardq.protocol import DecodedFrame, frame_too_large
from shardq.protocol._frames import decode_body
from shardq.runtime import _messages as msgs
from shardq.runtime._fds import FD_SPACE, carrying, descriptors_in
from shardq.runtime.links._control import pack, unpack

__all__ = ["HandedConns", "HandedDecoder", "HandoffChannel"]

# How long a send on the channel may wait for the front end to read (then it is given up).
_SEND_WAIT_MS: Final = 1_000
# A connection id longer than this is not remembered to be reported `gone` later (the front
# end's are `t<pid>.<n>`): with `tcp_handoff_gone_max`, the bound of their bytes.
_MAX_CONN_ID: Final = 64

_log = structlog.get_logger()


class HandedDecoder:
    """A `FrameDecoder` that keeps the bytes of the frames it decoded until the port says how
    many it served: the rest go back to the front end as they came."""

    __slots__ = ("_buf", "_ends", "max_frame_size", "returning")

    def __init__(self, max_frame_size: int, unread: bytes) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray(unread)
        self._ends: list[int] = []  # where each frame of the last `feed` ends in `_buf`
        self.returning = False  # read no further: the connection goes back

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[DecodedFrame]:
        """Add `data`; decode every whole frame. Call `served` after each batch."""
        buf = self._buf
        buf += data
        frames: list[DecodedFrame] = []
        ends = self._ends = []
        start, end = 0, len(buf)
        while end - start >= 4:
            size = int.from_bytes(buf[start : start + 4], "big")
            if size > self.max_frame_size:  # the front end answers it (and cuts)
                frames.append(ProtocolError(frame_too_large(size, self.max_frame_size)))
                ends.append(end)
                break
            stop = start + 4 + size
            if stop > end:
                break
            with memoryview(buf)[start + 4 : stop] as body:
                frames.append(decode_body(body))
            ends.append(stop)
            start = stop
        return frames

    def served(self, count: int) -> None:
        """The first `count` frames of the last `feed` were served: forget their bytes."""
        if count:
            del self._buf[: self._ends[count - 1]]
        self._ends = []

    def unread(self) -> bytes:
        """The bytes that go back with the connection."""
        return bytes(self._buf)


class _Port(Protocol):
    """What `HandedConns` uses of the `DirectPort` it is part of (connections are its
    `_Conn`s)."""

    _conns: dict[int, Any]
    _by_name: dict[str, Any]
    _max_connections: int
    _max_frame: int
    _poller: zmq.Poller
    _timed: set[Any]
    _adopted: list[Any]
    handed_off: int
    handed_back: int
    on_handback: Callable[[socket.socket, str, bytes], bool] | None
    on_gone: Callable[[str], None] | None
    unpark: Callable[[str], None] | None

    def _make_conn(self, sock: socket.socket, name: str) -> Any: ...
    def _take(
        self, conn: Any, frame: Any, items: list[list[Any]], replies: list[dict[str, Any]] | None
    ) -> bool: ...
    def _watch(self, conn: Any) -> None: ...
    def _idle(self, conn: Any) -> None: ...
    def _forget(self, conn: Any) -> bool: ...
    def _return_if_done(self, conn: Any) -> None: ...


class HandedConns:
    """The part of `DirectPort` that serves handed-off connections (a mixin: its connections
    and their polling are the port's)."""

    def _handed_frames(
        self: _Port, conn: Any, decoder: HandedDecoder, frames: list[Any], items: list[list[Any]]
    ) -> bool:
        """A handed-off connection's frames: served up to the first this port does not
        serve, which with all after it goes back to the front end (`shard._handoff`); True
        if the connection goes back."""
        served = 0
        for frame in frames:
            if not self._take(conn, frame, items, None):
                decoder.returning = True
                break
            served += 1
        decoder.served(served)
        if decoder.returning:
            conn.deadline = None
            self._timed.discard(conn)
            self._watch(conn)
            if conn.inflight and self.unpark is not None:
                self.unpark(conn.name)  # its long-polls answered now, as their timeout would
            self._return_if_done(conn)
        return decoder.returning

    def adopt(self: _Port, sock: socket.socket, name: str, unread: bytes) -> bool:
        """Serve a connection the front end handed over, `unread` first; False (nothing
        kept) at the connection cap or without a way back."""
        if len(self._conns) >= self._max_connections or self.on_handback is None:
            return False
        sock.setblocking(False)
        conn = self._make_conn(sock, name)
        conn.decoder = HandedDecoder(self._max_frame, unread)
        self._conns[sock.fileno()] = conn
        self._by_name[name] = conn
        self._poller.register(sock.fileno(), zmq.POLLIN)
        self.handed_off += 1
        self._idle(conn)
        if unread:  # looked at by the next `serve`: `took` goes to the front end first
            self._adopted.append(conn)
        return True

    def hand_back_all(self: _Port) -> None:
        """Stopping: read no handed-off connection further; each goes back once its replies
        are written."""
        for conn in list(self._conns.values()):
            decoder = conn.decoder
            if type(decoder) is HandedDecoder and not decoder.returning:
                decoder.returning = True
                self._watch(conn)
                if conn.inflight and self.unpark is not None:
                    self.unpark(conn.name)
                self._return_if_done(conn)

    def _return_if_done(self: _Port, conn: Any) -> None:
        decoder = conn.decoder
        if conn.inflight or conn.out or type(decoder) is not HandedDecoder:
            return
        if not decoder.returning or self.on_handback is None:
            return
        self._forget(conn)
        if self.on_handback(conn.sock, conn.name, decoder.unread()):
            self.handed_back += 1
        elif self.on_gone is not None:
            self.on_gone(conn.name)
        conn.sock.close()  # the front end has its own copy now: no FIN


def _recv(sock: socket.socket, limit: int) -> tuple[bytes, list[int]] | None:
    """One message and the descriptors it carried; None when nothing waits."""
    try:
        data, ancdata, _flags, _addr = sock.recvmsg(limit, FD_SPACE)
    except (BlockingIOError, InterruptedError):
        return None
    return data, descriptors_in(ancdata)


class HandoffChannel:
    """This shard's end of the front end's handoff socket, polled by the shard's loop.

    `adopt(fd, conn, unread)` gives a connection to the direct port (False: it cannot take it).
    """

    def __init__(
        self,
        path: str,
        poller: zmq.Poller,
        adopt: Callable[[socket.socket, str, bytes], bool],
        max_bytes: int,
        gone_max: int = 0,
    ) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a previous run's
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(path)
        self._listener.listen(4)
        self._listener.setblocking(False)
        self.path = path
        self._poller = poller
        self._adopt = adopt
        self._max_bytes = max_bytes
        self._chan: socket.socket | None = None
        self.stopping = False  # no more connections taken
        # Connections that ended with no front end to tell (`gone`), oldest first: reported
        # to the next front end that connects (`tcp_handoff_gone_max` of them at most).
        self._gone_max = gone_max
        self._unreported: dict[str, None] = {}
        self.gone_forgotten = 0  # past the bound: their leases wait for their lockTtl
        poller.register(self._listener.fileno(), zmq.POLLIN)

    def fds(self) -> tuple[int, ...]:
        chan = self._chan
        fd = self._listener.fileno()
        return (fd,) if chan is None else (fd, chan.fileno())

    def serve(self, ready: dict[Any, int]) -> None:
        if self._listener.fileno() in ready:
            self._accept()
        chan = self._chan
        if chan is not None and chan.fileno() in ready:
            self._read(chan)

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            sock, _ = self._listener.accept()
            self._close_chan()  # a front end that restarted: only the newest one counts
            sock.setblocking(False)
            self._chan = sock
            self._poller.register(sock.fileno(), zmq.POLLIN)
            self._report_gone()

    def _read(self, chan: socket.socket) -> None:
        while self._chan is chan:
            try:
                got = _recv(chan, self._max_bytes + 4096)
            except OSError:
                got = (b"", [])
            if got is None:
                return
            data, fds = got
            if not data and not fds:
                self._close_chan()  # the front end went away
                return
            self._take(data, fds)

    def _take(self, data: bytes, fds: list[int]) -> None:
        try:
            msg = unpack(data)
        except ValueError:
            msg = {}
        conn, unread = msg.get("conn"), msg.get("unread", b"")
        ok = False
        if msg.get("t") == msgs.HANDOFF and len(fds) == 1 and isinstance(conn, str):
            sock = socket.socket(fileno=fds.pop())
            ok = not self.stopping and isinstance(unread, bytes) and self._adopt(sock, conn, unread)
            if not ok:
                sock.close()  # the front end still holds its copy (no FIN): it resumes it
        for fd in fds:  # anything else it carried is not ours to keep
            os.close(fd)
        if isinstance(conn, str):
            self.send(msgs.took(conn, ok))

    def hand_back(self, sock: socket.socket, conn: str, unread: bytes) -> bool:
        """Send `sock` back to the front end with `unread` (in pieces of at most
        `tcp_handoff_max_bytes`, the descriptor with the last); False if it cannot take it."""
        step = self._max_bytes
        pieces = [unread[i : i + step] for i in range(0, len(unread), step)] or [b""]
        for piece in pieces[:-1]:
            if not self.send(msgs.handback(conn, piece, more=True)):
                return False
        return self.send(msgs.handback(conn, pieces[-1]), sock.fileno())

    def gone(self, conn: str) -> None:
        """A handed-off connection closed here: the front end releases what it held for it.
        With no front end to tell (it is restarting), it is told the next that connects."""
        if not self.send(msgs.gone(conn)):
            self._remember(conn)

    def _remember(self, conn: str) -> None:
        unreported = self._unreported
        if self._gone_max <= 0 or len(conn) > _MAX_CONN_ID:
            return
        if len(unreported) >= self._gone_max:
            del unreported[next(iter(unreported))]
            self.gone_forgotten += 1
            if self.gone_forgotten == 1:
                _log.warning("ended handed-off connections past tcp_handoff_gone_max: "
                             "the oldest forgotten, their leases kept to lockTtl")  # fmt: skip
        unreported[conn] = None

    def _report_gone(self) -> None:
        """Tell a front end that connected which connections ended while none was there: it
        releases their leases on every shard (a `close` each)."""
        unreported = self._unreported
        if unreported:
            _log.info("reporting handed-off connections that ended", count=len(unreported))
        while unreported and self._chan is not None:
            conn = next(iter(unreported))
            if not self.send(msgs.gone(conn)):
                return  # the channel is closed: kept for the next
            del unreported[conn]

    def send(self, msg: msgs.TookMsg | msgs.HandbackMsg | msgs.GoneMsg, fd: int = -1) -> bool:
        """Send one message (with `fd`, if given) to the front end; False if it cannot."""
        chan = self._chan
        if chan is None:
            return False
        anc = carrying(fd)
        data = pack(msg)
        for _ in range(2):
            try:
                chan.sendmsg([data], anc)
                return True
            except (BlockingIOError, InterruptedError):
                waiter = select.poll()
                waiter.register(chan.fileno(), select.POLLOUT)
                if not waiter.poll(_SEND_WAIT_MS):
                    break
            except OSError:
                break
        _log.warning("handoff channel: the front end does not read; closing it", t=msg["t"])
        self._close_chan()
        return False

    def _close_chan(self) -> None:
        chan, self._chan = self._chan, None
        if chan is not None:
            with contextlib.suppress(KeyError, zmq.ZMQError):
                self._poller.unregister(chan.fileno())
            chan.close()

    def close(self) -> None:
        self._close_chan()
        with contextlib.suppress(KeyError, zmq.ZMQError):
            self._poller.unregister(self._listener.fileno())
        self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
