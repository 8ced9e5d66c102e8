"""`SyncZmqTransport`: one ZeroMQ DEALER, safe to share between threads, with no I/O thread.

A ZeroMQ socket may be used by one thread at a time, and moved between threads behind a lock.
The socket lock (`_io`) is held by whoever touches the DEALER or its monitor: a caller that
finds it free writes its request itself; the thread whose turn it is to read (`Turns`) holds
it while it polls. A lone caller thus sends and receives in its own thread: the only other
thread a request wakes is libzmq's own I/O thread. (Before, a thread of this transport owned
the socket, and every request crossed it twice: two wake-ups per request on top of the
server's.) A caller that finds the socket busy (another thread polls it) leaves its messages
in an outbox and wakes the poller through a socket pair; the poller sends them.

`IMMEDIATE` keeps messages off a pipe that has no completed connection, and a socket monitor
reports the handshake and the disconnect, so a server restart fails the waiting requests with
`ConnectionLost` instead of leaving them to time out, and nothing is sent on a new connection
before `Auth`. Whoever reads watches the monitor too; between requests, `alive` reads it.
"""

from __future__ import annotations

import contextlib
import math
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Final

import zmq

from shardq.client._core import ClientCore, Framing, fail_waiters
from shardq.client._errors import ConnectionLost
from shardq.client._turns import Pending, Turns, resolve
from shardq.client._url import ClientSecurity, Endpoint
from shardq.client._zmq_sockets import (
    MONITOR_EVENTS,
    close_monitored,
    dealer_event,
    monitor_event,
    monitor_socket,
    new_dealer,
)

__all__ = ["SyncZmqTransport"]

Reply = dict[str, Any]
Futures = list[Pending]
_CLOSE_WAIT_S: Final = 5.0  # how long close() waits for a reading thread to let go


class SyncZmqTransport:
    """One ZeroMQ DEALER, used by the calling threads in turn (see the module docstring)."""

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
        # The sockets' own descriptors, polled directly (see `_poll`); a `zmq.Poller` would
        # check every socket's pending commands before and after each wait, a dozen syscalls
        # per request.
        self._sock_fd: int = self._sock.getsockopt(zmq.FD)
        self._monitor_fd: int = self._monitor.getsockopt(zmq.FD)
        self._poller = select.poll()
        for fd in (self._sock_fd, self._monitor_fd, self._wake_r.fileno()):
            self._poller.register(fd, select.POLLIN)
        self._monitor_poll = select.poll()
        self._monitor_poll.register(self._monitor_fd, select.POLLIN)
        self._drained = True  # DEALER: `recv` said "nothing" since the last send (see `_poll`)
        self._core: ClientCore[Pending] = ClientCore(Framing.MESSAGE)
        self._lock = threading.Lock()  # the core, the outbox and `_dead`; never held in I/O
        self._io = threading.Lock()  # whoever holds it may use the DEALER and its monitor
        self._outbox: deque[tuple[list[str], list[bytes]]] = deque()
        self._turns = Turns()
        self._handshaken = False
        self._closed = False  # the sockets are closed (under `_io`)
        self._dead: str | None = None
        self._sock.connect(endpoint.zmq_address)
        try:
            self._await_handshake(connect_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        """False once the connection broke. Between requests nobody watches the monitor,
        so a disconnect that happened meanwhile is read here (unless another thread reads)."""
        if self._dead is None and self._io.acquire(blocking=False):
            try:
                if self._dead is None and self._monitor_poll.poll(0):
                    self._on_monitor()
            finally:
                self._io.release()
        return self._dead is None

    def request(self, commands: Sequence[Mapping[str, Any]]) -> tuple[list[str], Futures]:
        futures = [Pending() for _ in commands]
        with self._lock:
            if self._dead is not None:
                raise ConnectionLost(self._dead, sent=False)
            rids, bodies = self._core.prepare(commands, futures)
            self._outbox.append((rids, bodies))
        if self._io.acquire(blocking=False):
            try:
                self._send_outbox()  # everything queued before, then this: order is kept
            except zmq.ZMQError as e:
                self._die(f"ZeroMQ error on {self._endpoint}: {e}")
            finally:
                self._io.release()
        else:
            self._wake()  # another thread holds the socket: it sends the outbox
        return rids, futures

    def wait(self, futures: Futures, deadline: float) -> None:
        self._turns.wait(futures, deadline, self._read_until)

    def forget(self, rids: Sequence[str]) -> None:
        with self._lock:
            self._core.forget(rids)

    def close(self) -> None:
        """Close the socket; requests still waiting fail with `ConnectionLost`."""
        self._die("the connection was closed by the client")
        self._wake()  # a thread polling the socket lets go of it
        if self._io.acquire(timeout=_CLOSE_WAIT_S):
            try:
                self._close_sockets()
            finally:
                self._io.release()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already holds a wake-up; or closed
            self._wake_w.send(b"\0")

    # -- with `_io` held ---------------------------------------------------------------------

    def _await_handshake(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._io:
            while not self._handshaken and self._dead is None:
                left = deadline - time.monotonic()
                if left <= 0 or not self._monitor.poll(math.ceil(left * 1000)):
                    break
                self._on_monitor()
        if not self._handshaken or self._dead is not None:
            reason = self._dead or f"no handshake with {self._endpoint} within {timeout:g} s"
            raise ConnectionLost(f"cannot connect to {self._endpoint}: {reason}", sent=False)

    def _read_until(self, future: Pending, deadline: float) -> None:
        """This thread's turn to read: hold the socket until `future` is done."""
        with self._io:
            try:
                while not future.done() and self._dead is None:
                    self._send_outbox()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._poll(left)
            except zmq.ZMQError as e:
                self._die(f"ZeroMQ error on {self._endpoint}: {e}")
            if self._dead is not None:
                self._close_sockets()

    def _poll(self, timeout: float) -> None:
        """Wait up to `timeout` s for a reply, a monitor event or a wake-up; take them.

        A ZeroMQ socket's descriptor signals new commands to the socket, not readable
        messages: once an operation on the socket (a send too) has taken the commands, a
        message may wait with the descriptor quiet. So the DEALER is read until it says
        "nothing" before its descriptor is waited on. The monitor is only ever read, until
        it says "nothing", so its descriptor is exact.
        """
        if not self._drained and self._receive():
            return  # replies came: the caller checks whether its own is in
        ready = self._poller.poll(math.ceil(timeout * 1000))
        fds = {fd for fd, _ in ready}
        if self._monitor_fd in fds:
            self._on_monitor()
        if self._wake_r.fileno() in fds:
            with contextlib.suppress(OSError):
                self._wake_r.recv(4096)
        if self._sock_fd in fds:
            self._drained = False
            self._receive(until_one=True)

    def _on_monitor(self) -> None:
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = monitor_event(frames)
            handshaken, dead = dealer_event(event, self._handshaken, self._endpoint)
            self._handshaken = handshaken
            if dead is not None:
                self._die(dead)
                return

    def _send_outbox(self) -> None:
        while True:
            with self._lock:
                if not self._outbox or self._dead is not None:
                    return
                rids, bodies = self._outbox.popleft()
            sent = 0
            try:
                self._drained = False  # a send may take the commands that announce a reply
                for body in bodies:
                    self._sock.send(body, zmq.NOBLOCK)
                    sent += 1
            except zmq.Again:
                # IMMEDIATE: no completed connection to queue on. Fail just these.
                with self._lock:
                    waiting = self._core.take(rids)
                fail_waiters(waiting, f"not connected to {self._endpoint}", sent=sent > 0)
                self._turns.wake_followers()

    def _receive(self, *, until_one: bool = False) -> int:
        """Read the replies that are in; with `until_one`, stop at the first one read (the
        next reader drains the rest before it waits). Returns how many it resolved."""
        matched = []
        while True:
            try:
                body = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                self._drained = True
                break
            with self._lock:
                pair = self._core.receive(body)
            if pair is not None:
                matched.append(pair)
                if until_one:
                    break
        if matched:
            resolve(matched)
            self._turns.wake_followers()
        return len(matched)

    def _close_sockets(self) -> None:
        if self._closed:
            return
        self._closed = True
        close_monitored(self._sock, self._monitor)
        self._wake_r.close()
        self._wake_w.close()

    # -- any thread ----------------------------------------------------------------------------

    def _die(self, reason: str) -> None:
        """Mark the connection dead and fail every waiting request (the sockets are closed
        by whoever holds them next)."""
        with self._lock:
            if self._dead is not None:
                return
            self._dead = reason
            waiting = self._core.fail_all()
            self._outbox.clear()
        fail_waiters(waiting, reason)
        self._turns.wake_followers()
