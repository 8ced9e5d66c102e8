"""Blocking transports: one TCP or ZeroMQ connection, safe to share between threads.

Each is a thin adapter around a `ClientCore`, with no thread of its own: the threads waiting
for replies take turns reading the socket (`shardq.client._turns`), so a lone caller writes
its request and reads its reply itself, and no second thread is woken per request. Callers
get one `Pending` per command (`_turns`: a reply slot, lighter than a `Future`) and wait with
a deadline, so many requests from many threads are in flight on one connection. A transport
lives for one connection: once it breaks, every waiting request fails with `ConnectionLost`
and the owner opens a new one. The ZeroMQ transport is in `shardq.client._sync_zmq`, which
only a `zmq://` connection imports: this module loads neither ZeroMQ, asyncio nor ssl.
"""

from __future__ import annotations

import contextlib
import math
import select
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from shardq.client._core import ClientCore, Framing, fail_waiters, no_reply
from shardq.client._errors import ConnectionLost
from shardq.client._sockets import connect_tcp
from shardq.client._turns import Pending, Turns, resolve
from shardq.client._url import ClientSecurity, Endpoint, closed_message

__all__ = ["SyncTcpTransport", "SyncTransport", "wait_replies"]

Reply = dict[str, Any]
Futures = list[Pending]
# The read buffer each TCP connection keeps. A reply larger than this (a PULLB of big jobs)
# is read in several pieces; the frame cutter joins them.
_RECV_BYTES: Final = 256 * 1024
FRESH_S: Final = 0.001
"""A shard's direct connection that wrote a request less than this long ago is not asked
whether the shard closed it before the next one (`SyncTcpTransport.fresh`). A shard closes a
direct connection on purpose in two ways: for idleness (`tcp_idle_close_ms`, 1 ms at the
least), counted from its reply to the last request, which cannot have come yet; and at a
stop, after a goodbye, which the read of the reply finds (then nothing unanswered was taken)."""


class SyncTransport(Protocol):
    """What the blocking `Connection` needs from a transport."""

    releases_on_close: bool
    """True if closing the connection makes the server release the jobs it leased (TCP)."""

    @property
    def alive(self) -> bool: ...

    def request(self, commands: Sequence[Mapping[str, Any]]) -> tuple[list[str], Futures]:
        """Send `commands`; return their request ids and one future per reply.

        Raises:
            ConnectionLost: the connection is gone (`sent=False`: nothing was written).
            SerializationError: a command cannot be encoded (nothing was sent).
        """
        ...

    def wait(self, futures: Futures, deadline: float) -> None:
        """Return once every future is done. Raises `TimeoutError` at `deadline` (monotonic)."""
        ...

    def forget(self, rids: Sequence[str]) -> None: ...

    def close(self) -> None: ...


def wait_replies(
    transport: SyncTransport,
    commands: Sequence[Mapping[str, Any]],
    timeout: float,
) -> list[Reply]:
    """Send `commands` and return their replies in order, all within `timeout` seconds.

    Raises:
        CommandTimeout: some reply did not come in time (the rest are given up on too).
        ConnectionLost: the connection broke first.
        SerializationError: a command cannot be encoded.
    """
    rids, futures = transport.request(commands)
    try:
        transport.wait(futures, time.monotonic() + timeout)
        return [f.result() for f in futures]
    except TimeoutError:
        transport.forget(rids)
        name = commands[0].get("cmd") if commands else None
        raise no_reply(name, timeout) from None


class SyncTcpTransport:
    """One TCP connection, read by the threads that wait on it (`Turns`): no reader thread.

    Writes happen in the calling thread. The socket is blocking, with the kernel's send and
    receive timeouts instead of Python's (which would `poll` before every `send` and `recv`).
    The leader reads with one blocking `recv` while its deadline is further off than the
    receive timeout (the timeout ends it empty-handed), else it polls once with the deadline
    first; replies are read into one buffer the connection keeps (a fresh megabyte per `recv`
    cost an mmap and a munmap). A request is thus a `send` and a `recv`, after the owner's
    liveness look (`alive`, a `poll` with no wait), which the direct path skips on a
    connection that wrote a request less than `FRESH_S` ago (`fresh`).
    """

    releases_on_close = True

    def __init__(
        self, endpoint: Endpoint, connect_timeout: float, security: ClientSecurity
    ) -> None:
        try:  # a TLS handshake runs here too, bounded by the connect timeout
            sock = connect_tcp(endpoint, connect_timeout, security)
            # A send that cannot progress for this long (a peer that stopped reading) breaks
            # the connection instead of blocking a caller forever; so does a TLS record that
            # stops halfway. A read whose deadline is further off blocks in `recv` itself
            # (the timeout ends it with nothing read); a nearer one waits in `poll` first.
            sock.settimeout(None)
            stall_s = max(connect_timeout, 1.0)
            stall = _timeval(stall_s)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, stall)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, stall)
        except OSError as e:
            raise ConnectionLost(f"cannot connect to {endpoint}: {e}", sent=False) from e
        self._sock = sock
        self._tls = endpoint.tls  # `connect_tcp` wrapped it in TLS (no `import ssl` to ask)
        # A read that may wait this long needs no `poll` first: the kernel's receive timeout
        # ends it (`_read`).
        self._stall_s = stall_s
        self._sent_at = 0.0  # monotonic: when the last request was written (`fresh`)
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._buffer = bytearray(_RECV_BYTES)
        self._view = memoryview(self._buffer)
        self._endpoint = endpoint
        self._core: ClientCore[Pending] = ClientCore(Framing.STREAM)
        self._core_lock = threading.Lock()  # short sections only; never held during I/O
        self._send_lock = threading.Lock()  # keeps the frames of concurrent writers whole
        self._turns = Turns()
        self._dead: str | None = None
        self._answered = False  # any bytes from the server yet (for the TLS hint)

    @property
    def ended(self) -> bool:
        """Whether the server ended the connection with its goodbye (a stopping shard's direct
        port): the requests it failed were not applied (`ConnectionLost(sent=False)`)."""
        return self._core.ended

    @property
    def alive(self) -> bool:
        """False once the connection broke; a server that closed it is noticed here, too
        (one `poll` with no wait), so a request is not written to a closed connection."""
        if self._dead is None and self._turns.lead():
            try:
                self._read(0.0)  # takes a close (or late replies) waiting in the socket
            finally:
                self._turns.step_down()
        return self._dead is None

    @property
    def fresh(self) -> bool:
        """True while the connection is not known to be broken and wrote a request less than
        `FRESH_S` ago: a caller sending back to back to a shard's direct port need not ask
        the socket whether it was closed (`alive`, a `poll` per request)."""
        return self._dead is None and time.monotonic() - self._sent_at < FRESH_S

    def request(self, commands: Sequence[Mapping[str, Any]]) -> tuple[list[str], Futures]:
        futures = [Pending() for _ in commands]
        with self._core_lock:
            if self._dead is not None:
                raise ConnectionLost(self._dead, sent=False)
            rids, payloads = self._core.prepare(commands, futures)
            self._sent_at = time.monotonic()
        try:
            with self._send_lock:
                self._sock.sendall(payloads[0])
        except (BrokenPipeError, ConnectionResetError):
            # The server closed the connection. Whether it said goodbye first (a stopping
            # shard's direct port: then nothing unanswered was taken) is in what is left to
            # read, so the reader decides; it sees the goodbye or the close at once.
            pass
        except OSError as e:
            self._die(f"connection to {self._endpoint} lost while sending: {e}")
        return rids, futures

    def wait(self, futures: Futures, deadline: float) -> None:
        self._turns.wait(futures, deadline, self._read_until)

    def forget(self, rids: Sequence[str]) -> None:
        with self._core_lock:
            self._core.forget(rids)

    def close(self) -> None:
        """Close the connection; requests still waiting fail with `ConnectionLost`."""
        self._die("the connection was closed by the client")

    def _read_until(self, future: Pending, deadline: float) -> None:
        while not future.done() and self._dead is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._read(left)

    def _read(self, timeout: float) -> None:
        """Wait up to `timeout` s for data; resolve the replies it completes. Leader only."""
        try:
            if self._tls or timeout < self._stall_s:
                # TLS may hold decrypted bytes the socket no longer shows as readable.
                pending = self._tls and self._sock.pending() > 0  # type: ignore[attr-defined]
                if not pending and not self._poll.poll(math.ceil(timeout * 1000)):
                    return
            # Otherwise one blocking read, no `poll` before it: it returns with data, at a
            # close, or after the receive timeout (`_stall_s`) with nothing.
            size = self._sock.recv_into(self._buffer)
        except BlockingIOError:  # the receive timeout passed: nothing came
            return
        except OSError as e:
            self._die(f"connection to {self._endpoint} lost: {e}")
            return
        if not size:
            self._die(closed_message(self._endpoint, self._answered))
            return
        self._answered = True
        with self._core_lock:
            matched = self._core.feed(self._view[:size])
            broken = self._core.broken
        if matched:
            resolve(matched)
            self._turns.wake_followers()
        if broken is not None:
            self._die(f"the server at {self._endpoint} sent a bad frame: {broken}")
        elif self._core.ended:  # nothing still waiting was taken: safe to send elsewhere
            self._die(f"the server at {self._endpoint} ended the connection", sent=False)

    def _die(self, reason: str, *, sent: bool = True) -> None:
        with self._core_lock:
            if self._dead is not None:
                return
            self._dead = reason
            waiting = self._core.fail_all()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        fail_waiters(waiting, reason, sent=sent)
        self._turns.wake_followers()


def _timeval(seconds: float) -> bytes:
    """A `struct timeval` for SO_SNDTIMEO / SO_RCVTIMEO."""
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1e6))
