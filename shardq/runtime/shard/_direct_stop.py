"""How a shard's direct port ends its connections at a stop: the half of `DirectPort`
(`_direct.py`) that `quiesce`s the port, `release`s each connection with a goodbye once its
replies are written, and closes it once the client took every byte.

A mixin: `DirectPort` sets the attributes declared below and defines the methods named under
`TYPE_CHECKING`; `_direct.py`'s docstring tells the whole sequence.
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import termios
from typing import TYPE_CHECKING, Any, Final

import structlog
import zmq

from shardq.protocol import encode_js
from shardq.protocol._direct import direct_goodbye
from shardq.runtime.shard._direct_conn import Conn as _Conn
from shardq.runtime.shard._handoff import HandedDecoder

__all__ = ["READ_BYTES", "DirectStop"]

_log = structlog.get_logger()
READ_BYTES: Final = 256 * 1024  # one recv, as `DirectPort` reads


class DirectStop:
    """The stop sequence of the direct port, for `DirectPort`."""

    quiesced: bool
    released: int
    _conns: dict[int, _Conn]
    _timed: set[_Conn]
    _shut: set[_Conn]
    _poller: zmq.Poller
    _listener: socket.socket

    if TYPE_CHECKING:

        def _watch(self, conn: _Conn) -> None: ...

        def _write(self, conn: Any, data: bytes) -> None: ...

        def _drop(self, conn: _Conn) -> None: ...

        def _return_if_done(self, conn: _Conn) -> None: ...

    # -- the end, at a stop (see `_direct.py`'s docstring) ------------------------------------

    def quiesce(self) -> None:
        """Take no more requests: close the listener, read no connection further, and
        `release` each connection that waits for no reply (the others are released as `take`
        writes their last reply). Idempotent."""
        if self.quiesced:
            return
        self.quiesced = True
        with contextlib.suppress(KeyError, zmq.ZMQError):
            self._poller.unregister(self._listener.fileno())
        self._listener.close()
        self._timed.clear()
        waiting = 0
        for conn in list(self._conns.values()):
            conn.deadline = None
            conn.paused = True  # not read any more
            if conn.inflight or conn.closing:
                waiting += conn.inflight > 0
                self._watch(conn)  # its replies may still wait to be written
            else:
                self.release(conn)
        _log.info("direct port quiesced", connections=len(self._conns), waiting=waiting)

    def release(self, conn: _Conn) -> None:
        """End `conn`, which waits for no reply: its goodbye is its last frame, FIN follows
        once every reply is written, and the socket is closed once the client closed its side
        or took every byte (`_settle`)."""
        if conn.ending or conn.closing or self._conns.get(conn.sock.fileno()) is not conn:
            return
        if type(conn.decoder) is HandedDecoder:
            conn.decoder.returning = True  # no goodbye: it goes back to the front end
            self._return_if_done(conn)
            return
        conn.ending = True
        self.released += 1
        self._write(conn, encode_js(direct_goodbye()))

    def abandon(self) -> int:
        """Close the connections still waiting for replies (durable pushes whose commit the
        writer did not confirm in time, which may yet be applied: no goodbye for them).
        Returns how many."""
        late = [
            conn
            for conn in self._conns.values()
            if not conn.ending and (conn.inflight or type(conn.decoder) is not HandedDecoder)
        ]  # a handed-off connection goes back once its replies are written
        for conn in late:
            self._drop(conn)
        return len(late)

    def _shut_down(self, conn: _Conn) -> None:
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(conn)
            return
        conn.shut = True
        conn.paused = False  # read, and drop, what the client still sends until it closes
        self._shut.add(conn)
        self._watch(conn)

    def _discard(self, conn: _Conn) -> None:
        """A frame that comes after the goodbye is never taken; the client's close (or a
        broken connection) ends it."""
        try:
            data = conn.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)

    def _settle(self) -> None:
        """Close the ended connections whose client took every byte: a close now cannot
        reset the connection before the goodbye arrives."""
        for conn in [c for c in self._shut if _unacknowledged(c.sock) == 0]:
            self._drop(conn)


_OUTQ: Final = getattr(termios, "TIOCOUTQ", None)  # Linux's SIOCOUTQ


def _unacknowledged(sock: socket.socket) -> int:
    """The bytes sent on `sock` that its peer has not acknowledged (-1 if unknown: the
    connection then ends at the client's close, or at the shard's deadline)."""
    if _OUTQ is None:
        return -1
    try:
        raw = fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0")
    except OSError:
        return -1
    outq: int = struct.unpack("i", raw)[0]
    return outq
