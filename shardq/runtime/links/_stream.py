"""The front end <-> shard link: one Unix stream socket per shard, framed as u32 + msgpack.

Requests and replies between the front end and a shard are the latency path of every client
command, so they skip ZeroMQ. A ZeroMQ message crosses two extra threads (the sender's and
the receiver's I/O threads), and on a small VM each thread wake-up costs tens of
microseconds; a plain socket goes from one process's loop straight to the other's. Measured on
the 2-core machine: a sequential Count (front end -> shard -> front end) took about 165 µs over
ZeroMQ against 23 µs for a Ping the front end answers itself (BENCHMARKS.md §2).

The shard listens (`ChildSpec.link_path`); the front end connects once the shard is ready and
again after each restart. A frame is a big-endian u32 length and one msgpack map (`links._control`).
This module holds the framing and the shard's side, which is blocking code around a
`zmq.Poller` (it polls plain descriptors too); the front end's asyncio side is
`frontend._links`.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
from typing import Final

import structlog
from msgpack import packb  # type: ignore[import-untyped]

from shardq.protocol import FrameCutter, frame, send_frame

__all__ = [
    "LINK_ENVELOPE_BYTES",
    "FrameSplitter",
    "FrontLink",
    "prepare_listener",
    "read_frames",
    "split_batch",
    "write_frame",
]

_READ_SIZE: Final = 1 << 20
# Internal frames are whole request or reply batches; a bound keeps a corrupt length from
# making the reader wait for gigabytes. Each side's bound comes from `link_max_frame_bytes`
# (the senders split their batches under it, `split_batch`); this is the default.
MAX_FRAME_BYTES: Final = 256 * 1024 * 1024
# Room a request batch needs beyond the client frame it carries (connection, ids, envelope,
# headers).
LINK_ENVELOPE_BYTES: Final = 64 * 1024
# What a batch frame adds around its items: a 2-entry map header, "t", the kind, "items" and
# an array header of at most 5 bytes.
_BATCH_OVERHEAD: Final = 32

_log = structlog.get_logger()


def prepare_listener(path: str) -> socket.socket:
    """A non-blocking Unix stream listener on `path`, replacing a stale socket file there.

    Raises `OSError` if it cannot be bound.
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(64)
    except OSError:
        listener.close()
        raise
    listener.setblocking(False)
    return listener


def split_batch(kind: str, items: list[bytes], limit: int) -> list[bytes]:
    """Batch messages `{"t": kind, "items": [...]}` made of already packed `items`, in order,
    each at most `limit` bytes, except that an item too large for any frame goes alone (the
    caller decides what to do with those first: `batch_overhead`).

    Used only when a whole batch came out over the limit, so the cost of cutting it up is
    paid by the large replies that need it and never by the usual small batch.
    """
    head = packb("t") + packb(kind) + packb("items")
    frames: list[bytes] = []
    group: list[bytes] = []
    size = _BATCH_OVERHEAD
    for item in items:
        if group and size + len(item) > limit:
            frames.append(_batch(head, group))
            group, size = [], _BATCH_OVERHEAD
        group.append(item)
        size += len(item)
    if group:
        frames.append(_batch(head, group))
    return frames


def batch_overhead() -> int:
    """Bytes a batch frame adds to its items: an item larger than `limit` minus this can
    never be sent within `limit`."""
    return _BATCH_OVERHEAD


def _batch(head: bytes, items: list[bytes]) -> bytes:
    return b"".join([b"\x82", head, _array_header(len(items)), *items])


def _array_header(n: int) -> bytes:
    # msgpack's own array header (fixarray, array16, array32), not a frame's length.
    if n < 16:
        return bytes([0x90 | n])
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


class FrameSplitter:
    """Sans-IO: bytes in (any chunking), whole frame payloads out, in order: the protocol's
    `FrameCutter`, copying each payload out (callers keep them past the next read)."""

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._cutter = FrameCutter(max_frame)

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that is not complete yet."""
        return self._cutter.buffered

    def feed(self, chunk: bytes | memoryview) -> list[bytes]:
        """Add `chunk`; return every payload now complete. `chunk` is not kept: it may be a
        view of a buffer the caller reuses.

        Raises `ValueError` if a header announces more than the splitter's `max_frame`: the
        stream is corrupt (or the peer broke the limit) and the link must be dropped.
        """
        cutter = self._cutter
        payloads = cutter.cut(chunk, bytes)
        if cutter.oversize is not None:
            limit = cutter.max_frame_size
            raise ValueError(f"internal frame of {cutter.oversize} bytes exceeds {limit}")
        return payloads


class FrontLink:
    """The shard's end: a listening socket and at most one front-end connection.

    A new connection replaces the previous one (the front end restarted). Replies sent while
    no front end is connected are dropped: the connections they answer died with it.
    """

    def __init__(self, path: str, max_frame: int = MAX_FRAME_BYTES) -> None:
        """Bind and listen on `path` (a stale socket file is replaced); refuse request frames
        over `max_frame` bytes. Raises `OSError`."""
        self._listener = prepare_listener(path)
        self._conn: socket.socket | None = None
        self._max = max_frame
        self._splitter = FrameSplitter(max_frame)
        self._fds = [self._listener.fileno()]

    def fds(self) -> list[int]:
        """The descriptors to poll for reading: the listener and the connection, if any (none
        once closed). Kept, not built per call (a shard asks twice a loop turn); a change
        makes a new list, so one being iterated stays as it was. Not to be mutated."""
        return self._fds

    def _set_conn(self, conn: socket.socket | None) -> None:
        self._conn = conn
        listener = self._listener.fileno()
        self._fds = [listener] if conn is None else [listener, conn.fileno()]

    def readable(self, fd: int) -> list[bytes]:
        """`fd` (one of `fds()`) is ready: accept or read; return the complete payloads."""
        if fd == self._listener.fileno():
            self._accept()
            return []
        conn = self._conn
        if conn is None or fd != conn.fileno():
            return []
        payloads, lost = read_frames(conn, self._splitter)
        if lost is not None:
            self._drop(lost)
        return payloads

    def send(self, data: bytes, *, block: bool = True) -> bool:
        """Write one frame; False if it was dropped (no front end, or it went away).

        With `block`, a full socket buffer makes this wait until the front end reads: the
        back-pressure the runtime contract asks for. Without it, a frame that does not fit at
        once is dropped (used while stopping, when the front end may be gone).
        """
        conn = self._conn
        if conn is None:
            return False
        try:
            return write_frame(conn, data, block=block)
        except OSError as e:
            self._drop(f"write failed: {e}")
            return False

    def close(self) -> None:
        """Close the connection and the listener (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._set_conn(None)
        self._listener.close()
        self._fds = []

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                _log.warning("front end link accept failed", error=str(e))
                return
            if self._conn is not None:
                self._drop("a new front end connected")
            conn.setblocking(False)
            self._set_conn(conn)
            self._splitter = FrameSplitter(self._max)

    def _drop(self, reason: str) -> None:
        if self._conn is not None:
            _log.info("front end link closed", reason=reason)
            self._conn.close()
            self._set_conn(None)
            self._splitter = FrameSplitter(self._max)


class _ReadBuffer(threading.local):
    """One receive buffer per thread, reused by every read: `sock.recv(1 MiB)` allocates (and
    the kernel maps and zeroes) a fresh megabyte per call, about 12 µs on the 2-core machine
    even for a 100-byte frame, against 2 µs for `recv_into` an already touched buffer."""

    def __init__(self) -> None:
        self.view = memoryview(bytearray(_READ_SIZE))


_read_buffer = _ReadBuffer()


def read_buffer() -> memoryview:
    """This thread's reusable receive buffer (`_READ_SIZE` bytes) for `sock.recv_into`.

    Whatever is read into it must be copied out (`FrameSplitter.feed` does) before the next
    read on the same thread.
    """
    return _read_buffer.view


def read_frames(sock: socket.socket, splitter: FrameSplitter) -> tuple[list[bytes], str | None]:
    """Read what a non-blocking `sock` has; (whole payloads, why the link is lost or None)."""
    payloads: list[bytes] = []
    view = read_buffer()
    while True:
        try:
            n = sock.recv_into(view)
        except BlockingIOError:
            return payloads, None
        except OSError as e:
            return payloads, f"read failed: {e}"
        if not n:
            return payloads, "the peer closed the link"
        try:
            payloads.extend(splitter.feed(view[:n]))
        except ValueError as e:
            return payloads, str(e)
        if n < _READ_SIZE:
            return payloads, None


def write_frame(sock: socket.socket, data: bytes, *, block: bool) -> bool:
    """Write `data` as one frame to a non-blocking `sock`; raises `OSError` if the link broke.

    With `block`, waits while the socket is full. Without it, returns False if nothing could
    be written at once; a frame once started is always finished, so the stream stays whole.
    """
    try:
        rest = send_frame(sock.sendmsg, data)
    except BlockingIOError:
        if not block:
            return False
        rest = frame(data)
    view = memoryview(rest)
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            poller.poll()
    return True
