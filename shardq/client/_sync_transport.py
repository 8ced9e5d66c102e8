"""Blocking transports: one TCP or ZeroMQ connection, safe to share between threads.

Each is a thin adapter around a `ClientCore`. Over TCP the threads waiting for replies take
turns reading the socket, so a lone caller reads its own reply with no second thread woken;
over ZeroMQ, whose sockets are not thread-safe, a background thread owns the socket. Callers
get one `concurrent.futures.Future` per command and wait with a deadline, so many requests
from many threads are in flight on one connection. A transport lives for one connection:
once it breaks, every waiting request fails with `ConnectionLost` and the owner opens a new
one.
"""

from __future__ import annotations

import contextlib
import math
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Final, Protocol

import zmq
from zmq.utils.monitor import parse_monitor_message

from shardq.client._core import ClientCore, Framing, fail_waiters, no_reply
from shardq.client._errors import ConnectionLost
from shardq.client._sockets import (
    MONITOR_EVENTS,
    close_monitored,
    connect_tcp,
    dealer_event,
    monitor_socket,
    new_dealer,
)
from shardq.client._url import ClientSecurity, Endpoint, closed_message

__all__ = [
    "SyncTcpTransport",
    "SyncTransport",
    "SyncZmqTransport",
    "wait_replies",
]

Reply = dict[str, Any]
Futures = list["Future[Reply]"]
_RECV_BYTES: Final = 1 << 20
_JOIN_S: Final = 5.0  # how long close() waits for the I/O thread


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


def _resolve(matched: Sequence[tuple[Future[Reply], Reply]]) -> None:
    for future, reply in matched:
        if not future.done():
            future.set_result(reply)


class SyncTcpTransport:
    """One TCP connection, read by the threads that wait on it: no reader thread.

    A thread waiting for replies becomes the reader if nobody reads (the leader); it resolves
    every reply that arrives, its own and other threads', until its own are in, then hands
    the reading over to a waiting thread. One caller at a time thus reads its reply itself,
    with no wake-up of a second thread per request. Writes happen in the calling thread.
    """

    releases_on_close = True

    def __init__(
        self, endpoint: Endpoint, connect_timeout: float, security: ClientSecurity
    ) -> None:
        try:  # a TLS handshake runs here too, bounded by the connect timeout
            sock = connect_tcp(endpoint, connect_timeout, security)
        except OSError as e:
            raise ConnectionLost(f"cannot connect to {endpoint}: {e}", sent=False) from e
        # A send that cannot progress for this long (a peer that stopped reading) breaks the
        # connection instead of blocking a caller forever. Reads wait in `poll` instead.
        sock.settimeout(max(connect_timeout, 1.0))
        self._sock = sock
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)
        self._endpoint = endpoint
        self._core: ClientCore[Future[Reply]] = ClientCore(Framing.STREAM)
        self._core_lock = threading.Lock()  # short sections only; never held during I/O
        self._send_lock = threading.Lock()  # keeps the frames of concurrent writers whole
        self._turn = threading.Condition()  # guards `_reading` and `_followers`
        self._reading = False
        self._followers = 0  # threads waiting on `_turn` for their replies
        self._dead: str | None = None
        self._answered = False  # any bytes from the server yet (for the TLS hint)

    @property
    def alive(self) -> bool:
        """False once the connection broke; a server that closed it is noticed here, too."""
        if self._dead is None and self._lead():
            try:
                self._read(0.0)  # takes a close (or late replies) waiting in the socket
            finally:
                self._step_down()
        return self._dead is None

    def request(self, commands: Sequence[Mapping[str, Any]]) -> tuple[list[str], Futures]:
        futures: list[Future[Reply]] = [Future() for _ in commands]
        with self._core_lock:
            if self._dead is not None:
                raise ConnectionLost(self._dead, sent=False)
            rids, payloads = self._core.prepare(commands, futures)
        try:
            with self._send_lock:
                self._sock.sendall(payloads[0])
        except OSError as e:
            self._die(f"connection to {self._endpoint} lost while sending: {e}")
        return rids, futures

    def wait(self, futures: Futures, deadline: float) -> None:
        for future in futures:
            while not future.done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                if self._lead():
                    try:
                        self._read_until(future, deadline)
                    finally:
                        self._step_down()
                else:
                    self._follow(future, left)

    def forget(self, rids: Sequence[str]) -> None:
        with self._core_lock:
            self._core.forget(rids)

    def close(self) -> None:
        """Close the connection; requests still waiting fail with `ConnectionLost`."""
        self._die("the connection was closed by the client")

    def _lead(self) -> bool:
        with self._turn:
            if self._reading:
                return False
            self._reading = True
            return True

    def _follow(self, future: Future[Reply], timeout: float) -> None:
        """Wait while another thread reads, until it resolves `future` or steps down."""
        with self._turn:
            if self._reading and not future.done():
                self._followers += 1
                try:
                    self._turn.wait(timeout)
                finally:
                    self._followers -= 1

    def _step_down(self) -> None:
        with self._turn:
            self._reading = False
        self._wake_followers()  # one takes over the reading; all check their replies

    def _wake_followers(self) -> None:
        with self._turn:
            if self._followers:
                self._turn.notify_all()

    def _read_until(self, future: Future[Reply], deadline: float) -> None:
        while not future.done() and self._dead is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._read(left)

    def _read(self, timeout: float) -> None:
        """Wait up to `timeout` s for data; resolve the replies it completes."""
        try:
            # TLS may hold decrypted bytes the socket no longer shows as readable.
            pending = isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0
            if not pending and not self._poller.poll(math.ceil(timeout * 1000)):
                return
            data = self._sock.recv(_RECV_BYTES)
        except OSError as e:
            self._die(f"connection to {self._endpoint} lost: {e}")
            return
        if not data:
            self._die(closed_message(self._endpoint, self._answered))
            return
        self._answered = True
        with self._core_lock:
            matched = self._core.feed(data)
            broken = self._core.broken
        if matched:
            _resolve(matched)
            self._wake_followers()
        if broken is not None:
            self._die(f"the server at {self._endpoint} sent a bad frame: {broken}")

    def _die(self, reason: str) -> None:
        with self._core_lock:
            if self._dead is not None:
                return
            self._dead = reason
            waiting = self._core.fail_all()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        fail_waiters(waiting, reason)
        self._wake_followers()


class SyncZmqTransport:
    """One ZeroMQ DEALER owned by an I/O thread; callers hand it messages through a deque.

    `IMMEDIATE` keeps messages off a pipe that has no completed connection, and a socket
    monitor reports the handshake and the disconnect, so a server restart fails the waiting
    requests with `ConnectionLost` instead of leaving them to time out, and nothing is sent
    on a new connection before `Auth`.
    """

    releases_on_close = False  # the server's ROUTER sees no close; leases lapse by TTL

    def __init__(
        self,
        endpoint: Endpoint,
        connect_timeout: float,
        context: zmq.Context[Any] | None,
        security: ClientSecurity,
    ) -> None:
        ctx = context if context is not None else zmq.Context.instance()
        self._endpoint = endpoint
        self._sock: zmq.Socket[bytes] = new_dealer(ctx, security)
        self._monitor: zmq.Socket[bytes] = monitor_socket(self._sock, MONITOR_EVENTS)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._core: ClientCore[Future[Reply]] = ClientCore(Framing.MESSAGE)
        self._lock = threading.Lock()
        self._outbox: deque[tuple[list[str], list[bytes]]] = deque()
        self._connected = threading.Event()
        self._dead: str | None = None
        self._sock.connect(endpoint.zmq_address)
        self._thread = threading.Thread(
            target=self._run, name=f"shardq-zmq-{endpoint.port}", daemon=True
        )
        self._thread.start()
        if not self._connected.wait(connect_timeout) or self._dead is not None:
            reason = self._dead or f"no handshake with {endpoint} within {connect_timeout:g} s"
            self.close()
            raise ConnectionLost(f"cannot connect to {endpoint}: {reason}", sent=False)

    @property
    def alive(self) -> bool:
        return self._dead is None

    def request(self, commands: Sequence[Mapping[str, Any]]) -> tuple[list[str], Futures]:
        futures: list[Future[Reply]] = [Future() for _ in commands]
        with self._lock:
            if self._dead is not None:
                raise ConnectionLost(self._dead, sent=False)
            rids, bodies = self._core.prepare(commands, futures)
            self._outbox.append((rids, bodies))
        self._wake()
        return rids, futures

    def wait(self, futures: Futures, deadline: float) -> None:
        # The I/O thread resolves the futures; this thread only waits.
        for future in futures:
            future.result(max(0.0, deadline - time.monotonic()))

    def forget(self, rids: Sequence[str]) -> None:
        with self._lock:
            self._core.forget(rids)

    def close(self) -> None:
        """Close the socket; requests still waiting fail with `ConnectionLost`."""
        self._mark_dead("the connection was closed by the client")
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already holds a wake-up
            self._wake_w.send(b"\0")

    # -- the I/O thread --------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        poller.register(self._wake_r.fileno(), zmq.POLLIN)
        try:
            while self._dead is None:
                ready = dict(poller.poll())
                if self._monitor in ready:
                    self._on_monitor()
                if self._wake_r.fileno() in ready:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                self._send_outbox()
                if self._sock in ready:
                    self._receive()
        except zmq.ZMQError as e:
            self._mark_dead(f"ZeroMQ error on {self._endpoint}: {e}")
        finally:
            self._shutdown()

    def _on_monitor(self) -> None:
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)["event"]
            handshaken, dead = dealer_event(event, self._connected.is_set(), self._endpoint)
            if dead is not None:
                self._mark_dead(dead)
            if handshaken or dead is not None:
                self._connected.set()  # the connect attempt is over, one way or the other

    def _send_outbox(self) -> None:
        while self._outbox and self._dead is None:
            rids, bodies = self._outbox.popleft()
            sent = 0
            try:
                for body in bodies:
                    self._sock.send(body, zmq.NOBLOCK)
                    sent += 1
            except zmq.Again:
                # IMMEDIATE: no completed connection to queue on. Fail just these.
                with self._lock:
                    waiting = self._core.take(rids)
                fail_waiters(waiting, f"not connected to {self._endpoint}", sent=sent > 0)

    def _receive(self) -> None:
        while True:
            try:
                body = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            with self._lock:
                matched = self._core.receive(body)
            if matched is not None:
                _resolve([matched])

    def _mark_dead(self, reason: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = reason

    def _shutdown(self) -> None:
        with self._lock:
            reason = self._dead or "the connection closed"
            waiting = self._core.fail_all()
            self._outbox.clear()
        close_monitored(self._sock, self._monitor)
        self._wake_r.close()
        self._wake_w.close()
        fail_waiters(waiting, reason)
