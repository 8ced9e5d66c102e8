"""The shard <-> writer links: Unix stream sockets framed like the front-end links (`_stream`).

The writer listens on `ChildSpec.writer_link_path`; each shard connects once at start and again
whenever its link drops (the writer restarted). A durable push waits for a round trip over this
link plus a commit, and over ZeroMQ each direction also woke both sides' I/O threads: on the
2-core machine those wake-ups cost more than the commit itself.

Writer side (`ShardConnections`): any number of connections; a connection belongs to the shard
whose index its messages carry (the writer calls `claim`), and the front end's connection,
whose `front` message names `FRONT_END_SHARD`, takes the durable replies the writer hands
over. Writes never block: confirmations that do not fit in the socket wait in a
per-connection buffer, sent when it turns writable.

Shard side (`WriterLink`): one connection. Sends never block: what the socket does not take
waits in the link's buffer (`pending`), sent as the socket turns writable (`flush`), and
`stalled_for` says how long the writer has left it waiting. The shard turns that into
back-pressure it can bound (docs/runtime.md, `storage_stall_ms`): past a buffer cap it waits
for the writer, but never longer than the bound, and past the bound it refuses durable pushes
instead of blocking every client with a writer that does not read. While disconnected, sends
are dropped: the shard keeps every unconfirmed batch and resends them all when the link is
back (`reconnected()` is its cue, the old "writer-up").

Bells. Besides its link, each shard holds a second connection to the writer's bell listener
(`ChildSpec.writer_bell_path`), which carries single bytes, no frames. While a group commit is
pending, the writer leaves a link over which a buffered batch came unread until the commit's
deadline (docs/runtime.md, `writer_lazy_read_bytes`): buffered batches wait for that commit
anyway, and reading each as it came woke the writer once per push. A shard therefore rings
after sending what someone waits on while such a batch may be unconfirmed (a durable batch, a
`flush`, a `sync`), whenever its link has a backlog (the socket did not take everything, or
took some of it later) and past `unrung_max` bytes sent unrung; the writer reads every link
when a bell rings. The bytes are sent before the bell, so they are there to read then.
"""

from __future__ import annotations

import errno
import select
import socket
import time
from typing import Final

import structlog

from shardq.protocol import FRAME_HEADER, frame, send_frame
from shardq.runtime.links._stream import (
    MAX_FRAME_BYTES,
    FrameSplitter,
    prepare_listener,
    read_buffer,
    read_frames,
)

__all__ = ["ShardConnections", "WriterLink"]

_READ_SIZE: Final = 1 << 20
_BELL_READ: Final = 4096  # a bell's bytes mean nothing: read as many, at most, per turn
_RING: Final = b"!"
_HEADER_SIZE: Final = FRAME_HEADER.size
_UNPACK_HEADER: Final = FRAME_HEADER.unpack_from
RECONNECT_EVERY_MS: Final = 20

_log = structlog.get_logger()


class _Conn:
    __slots__ = ("held", "out", "shard", "sock", "splitter")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.splitter = FrameSplitter()
        self.held = False  # whether the splitter holds the start of a frame
        self.out = bytearray()
        self.shard: int | None = None


class ShardConnections:
    """The writer's end: a listener and the shards' connections, all non-blocking."""

    def __init__(self, path: str, bell_path: str | None = None) -> None:
        """Bind and listen on `path`, and on `bell_path` for the shards' bells if given (a
        stale socket file is replaced). Raises `OSError`."""
        self._listener = prepare_listener(path)
        self._conns: dict[int, _Conn] = {}  # by descriptor
        self._by_shard: dict[int, _Conn] = {}
        self._bell_listener = None if bell_path is None else prepare_listener(bell_path)
        self._bells: dict[int, socket.socket] = {}  # by descriptor
        # Changes whenever the descriptors to poll do: a connection or a bell comes or goes,
        # or a connection's unsent output appears or is all sent (`waiting_fds`). The writer
        # keeps its poll set while it stays the same.
        self.generation = 0

    def bell_fds(self) -> list[int]:
        """The bell listener and the bells (poll them for reading, always)."""
        if self._bell_listener is None:
            return []
        return [self._bell_listener.fileno(), *self._bells]

    def heard(self, fd: int) -> bool:
        """Serve bell descriptor `fd` (from `bell_fds`): True if a bell rang, so the links
        are to be read now. A new bell is accepted; a closed one is dropped."""
        listener = self._bell_listener
        if listener is not None and fd == listener.fileno():
            self._accept_bells(listener)
            return False
        bell = self._bells.get(fd)
        if bell is None:
            return False
        try:
            rang = bool(bell.recv(_BELL_READ))
        except BlockingIOError:
            return False
        except OSError:
            rang = False
        if not rang:  # closed: its shard went away, or reconnects with a new one
            del self._bells[fd]
            bell.close()
            self.generation += 1
        return rang

    def _accept_bells(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _addr = listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                _log.warning("shard bell accept failed", error=str(e))
                return
            sock.setblocking(False)
            self._bells[sock.fileno()] = sock
            self.generation += 1

    def listener_fd(self) -> int:
        return self._listener.fileno()

    def conn_fds(self) -> list[int]:
        """The connections' descriptors (poll them for reading)."""
        return list(self._conns)

    def waiting_fds(self) -> list[int]:
        """Connections with buffered output (poll them for writing)."""
        return [fd for fd, conn in self._conns.items() if conn.out]

    def accept(self) -> list[int]:
        """Take every pending connection; their descriptors."""
        new: list[int] = []
        while True:
            try:
                sock, _addr = self._listener.accept()
            except BlockingIOError:
                return new
            except OSError as e:
                _log.warning("shard link accept failed", error=str(e))
                return new
            sock.setblocking(False)
            self._conns[sock.fileno()] = _Conn(sock)
            new.append(sock.fileno())
            self.generation += 1

    def readable(self, fd: int, limit: int = _READ_SIZE) -> list[tuple[int, bytes]]:
        """Read what connection `fd` has (about `limit` bytes at most); (fd, payload) pairs."""
        conn = self._conns.get(fd)
        if conn is None:
            return []
        view = read_buffer()  # not a fresh `recv(limit)` allocation per read
        if limit < _READ_SIZE:
            view = view[:limit]
        try:
            n = conn.sock.recv_into(view)
        except BlockingIOError:
            return []
        except OSError as e:
            self._drop(conn, f"read failed: {e}")
            return []
        if not n:
            self._drop(conn, "shard closed the link")
            return []
        if n > _HEADER_SIZE and not conn.held:
            # Nearly always one whole frame (a batch, then the shard waits for its `done`):
            # its payload, without the splitter's general cutting.
            (size,) = _UNPACK_HEADER(view)
            if size == n - _HEADER_SIZE and size <= MAX_FRAME_BYTES:
                return [(fd, bytes(view[_HEADER_SIZE:n]))]
        splitter = conn.splitter
        try:
            frames = [(fd, payload) for payload in splitter.feed(view[:n])]
        except ValueError as e:
            self._drop(conn, str(e))
            return []
        conn.held = splitter.buffered > 0
        return frames

    def claim(self, fd: int, shard: int) -> None:
        """Connection `fd` speaks for `shard`; its confirmations go there from now on."""
        conn = self._conns.get(fd)
        if conn is not None and conn.shard != shard:
            conn.shard = shard
            self._by_shard[shard] = conn

    def send(self, shard: int, data: bytes) -> bool:
        """Queue one frame for `shard`; False if no connection speaks for it."""
        conn = self._by_shard.get(shard)
        if conn is None:
            return False
        if conn.out:  # behind what waits: in order, after it
            conn.out += frame(data)
            self._write(conn)
            return True
        # Nothing waits (nearly always: a `done` per commit): the frame goes straight to the
        # socket, and only what it does not take is kept, without copying the frame through
        # the buffer first.
        whole = frame(data)
        try:
            sent = conn.sock.send(whole)
        except BlockingIOError:
            sent = 0
        except OSError as e:
            self._drop(conn, f"write failed: {e}")
            return True
        if sent < len(whole):
            conn.out += whole[sent:]
            self.generation += 1  # to be watched for writing
        return True

    def fd_of(self, shard: int) -> int | None:
        """The descriptor of the connection that speaks for `shard`, if one does."""
        conn = self._by_shard.get(shard)
        return None if conn is None else conn.sock.fileno()

    def idle(self, shard: int) -> bool:
        """Whether a connection speaks for `shard` and has nothing waiting to be sent."""
        conn = self._by_shard.get(shard)
        return conn is not None and not conn.out

    def writable(self, fd: int) -> None:
        conn = self._conns.get(fd)
        if conn is not None:
            self._write(conn)

    def close(self) -> None:
        for conn in list(self._conns.values()):
            conn.sock.close()
        self._conns.clear()
        self._by_shard.clear()
        self._listener.close()
        for bell in self._bells.values():
            bell.close()
        self._bells.clear()
        if self._bell_listener is not None:
            self._bell_listener.close()

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError as e:
            self._drop(conn, f"write failed: {e}")
            return
        del conn.out[:sent]
        if not conn.out:
            self.generation += 1  # all sent: no longer watched for writing

    def _drop(self, conn: _Conn, reason: str) -> None:
        _log.info("shard link closed", shard=conn.shard, reason=reason)
        self._conns.pop(conn.sock.fileno(), None)
        self.generation += 1
        if conn.shard is not None and self._by_shard.get(conn.shard) is conn:
            del self._by_shard[conn.shard]
        conn.sock.close()


class WriterLink:
    """A shard's end: one connection to the writer, re-made when it drops."""

    def __init__(
        self,
        path: str,
        bell_path: str | None = None,
        unrung_max: int = 0,
        unrung_max_ops: int = 0,
    ) -> None:
        """`bell_path`: the writer's bell listener, None for no bell (a writer that reads
        every batch at once); `unrung_max`, `unrung_max_ops`: the bytes and the mutations
        sent at most between two rings (the latter the writer's `flush_max_mutations`, so
        that the count still starts a flush early)."""
        self._path = path
        self._bell_path = bell_path
        self._sock: socket.socket | None = None
        self._bell: socket.socket | None = None
        self._unrung_max = unrung_max
        self._unrung = 0  # bytes sent since the last ring
        self._unrung_max_ops = unrung_max_ops
        self._unrung_ops = 0  # mutations sent since the last ring
        self._splitter = FrameSplitter()
        self._out = bytearray()  # what the socket has not taken yet (whole frames)
        self._waiting_since: float | None = None  # when `_out` last became non-empty

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def fd(self) -> int | None:
        return None if self._sock is None else self._sock.fileno()

    def connect(self) -> bool:
        """Try once to connect; True on success (and at once if already connected)."""
        if self._sock is not None:
            return True
        sock = _connect(self._path)
        if sock is None:
            return False
        # The bell first: a writer must not take a link it cannot wake (`ShardConnections`).
        if self._bell_path is not None:
            bell = _connect(self._bell_path)
            if bell is None:
                sock.close()
                return False
            self._bell = bell
        self._sock = sock
        self._splitter = FrameSplitter()
        return True

    def ring(self) -> None:
        """Ask the writer to read its links now. A full bell is a bell already ringing."""
        bell = self._bell
        if bell is None:
            return
        self._unrung = self._unrung_ops = 0
        try:
            bell.send(_RING)
        except BlockingIOError:
            pass
        except OSError as e:
            self._drop(f"bell failed: {e}")

    def readable(self) -> list[bytes]:
        """Read everything waiting; whole payloads out. A closed link is noted, not raised."""
        if self._sock is None:
            return []
        payloads, lost = read_frames(self._sock, self._splitter)
        if lost is not None:
            self._drop(lost)
        return payloads

    @property
    def pending(self) -> int:
        """Bytes sent but not yet taken by the socket."""
        return len(self._out)

    def stalled_for(self, now: float) -> float:
        """Seconds the oldest unsent byte has waited (0 when nothing waits); `now` is
        `time.monotonic()`."""
        since = self._waiting_since
        return 0.0 if since is None or not self._out else now - since

    def send(self, data: bytes, urgent: bool = False, ops: int = 0) -> bool:
        """Queue one frame (of `ops` mutations) and write what the socket takes now; never
        blocks. False if the link is down (the frame is dropped). `urgent`: someone waits on
        it, so the writer is rung; so it is whenever bytes are left waiting, and past the
        bounds of what is sent unrung."""
        sent = self._send(data)
        self._unrung += len(data)
        self._unrung_ops += ops
        if sent and (
            urgent
            or self._out
            or self._unrung > self._unrung_max
            or self._unrung_ops >= self._unrung_max_ops
        ):
            self.ring()
        return sent and self._sock is not None

    def _send(self, data: bytes) -> bool:
        sock = self._sock
        if sock is None:
            return False
        if self._out:
            self._out += frame(data)
            return self.flush()
        try:
            # The common case: the writer keeps up, and the frame goes out whole, uncopied.
            rest = send_frame(sock.sendmsg, data)
        except BlockingIOError:
            rest = frame(data)
        except OSError as e:
            self._drop(f"write failed: {e}")
            return False
        if rest:
            self._out += rest  # the rest of a frame begun: the stream stays whole
            self._waiting_since = time.monotonic()
        return True

    def flush(self) -> bool:
        """Write what the socket takes of the waiting bytes; False if the link broke."""
        sock = self._sock
        if sock is None:
            return False
        moved = False
        while self._out:
            try:
                sent = sock.send(self._out)
            except BlockingIOError:
                break
            except OSError as e:
                self._drop(f"write failed: {e}")
                return False
            del self._out[:sent]
            moved = True
            self._waiting_since = time.monotonic()  # the writer reads: the wait starts over
        if moved:
            # What a backlog held may be what someone waits on: the writer reads it now.
            self.ring()
        return self._sock is not None

    def wait_writable(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the socket to take more, then write what it takes."""
        if self._sock is None or not self._out:
            return
        poller = select.poll()
        poller.register(self._sock, select.POLLOUT)
        if poller.poll(max(0, int(timeout_s * 1000))):
            self.flush()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._close_bell()
        self._out.clear()

    def _close_bell(self) -> None:
        if self._bell is not None:
            self._bell.close()
            self._bell = None

    def _drop(self, reason: str) -> None:
        self._close_bell()
        if self._sock is not None:
            _log.warning("writer link lost", reason=reason)
            self._sock.close()
            self._sock = None
        # A frame cut short cannot continue on a new connection; the shard resends what the
        # writer did not confirm.
        self._out.clear()


def _connect(path: str) -> socket.socket | None:
    """A non-blocking connection to the writer's socket at `path`; None if it is not there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as e:
        sock.close()
        if e.errno not in (errno.ENOENT, errno.ECONNREFUSED):
            _log.warning("cannot connect to the writer", error=str(e))
        return None
    sock.setblocking(False)
    return sock
