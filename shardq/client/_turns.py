"""Taking turns at a socket: the threads that wait for replies read for each other.

Both blocking transports work this way, with no I/O thread of their own. A thread waiting for
replies becomes the reader if nobody reads (the leader); it resolves every reply that
arrives, its own and other threads', until its own are in, then steps down and wakes the
threads that wait (the followers), one of which takes over. A lone caller thus reads its own
reply: a request costs the wake-up of no thread but the caller.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import InvalidStateError
from typing import Any

__all__ = ["Pending", "Turns", "resolve"]

Reply = dict[str, Any]


class Pending:
    """One request's reply, or why it cannot come: what a blocking transport hands its caller.

    The part of `concurrent.futures.Future` the transports use, without its condition and
    lock (a `Future` took its condition in `__init__`, `done`, `set_result` and `result`,
    some twenty Python calls a request): threads wait on the turns' condition (`Turns`), and
    exactly one path settles a request, the match of its reply or the failure of the
    connection, each after taking it out of the core's table under the transport's lock. The
    first outcome set stays; a later one is ignored."""

    __slots__ = ("_done", "_error", "_reply")

    def __init__(self) -> None:
        self._done = False
        self._reply: Reply | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, reply: Reply) -> None:
        if not self._done:
            self._reply = reply
            self._done = True

    def set_exception(self, exception: BaseException) -> None:
        if not self._done:
            self._error = exception
            self._done = True

    def result(self) -> Reply:
        """The reply. Raises the exception set instead, or `InvalidStateError` if neither
        was set yet."""
        if self._error is not None:
            raise self._error
        if self._reply is None:
            raise InvalidStateError("no reply yet")
        return self._reply

    def exception(self) -> BaseException | None:
        """The exception set, or None (a reply, or nothing yet)."""
        return self._error


def resolve(matched: Sequence[tuple[Pending, Reply]]) -> None:
    for pending, reply in matched:
        pending.set_result(reply)


class Turns:
    """Who reads now: at most one leader; the other waiting threads sleep as followers."""

    def __init__(self) -> None:
        # Guards `_reading` and `_followers`. Taken as the plain lock (`with self._lock`, no
        # Python frame) on every request, twice or three times; the condition only to sleep
        # and to wake. Nothing takes it twice, so it need not be reentrant.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._reading = False
        self._followers = 0  # threads waiting on `_cond` for their replies

    def wait(
        self,
        futures: Sequence[Pending],
        deadline: float,
        read_until: Callable[[Pending, float], None],
    ) -> None:
        """Return once every future is done, reading with `read_until(future, deadline)`
        while this thread leads. Raises `TimeoutError` at `deadline` (monotonic)."""
        for future in futures:
            while not future.done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                if self.lead():
                    try:
                        read_until(future, deadline)
                    finally:
                        self.step_down()
                else:
                    self._follow(future, left)

    def lead(self) -> bool:
        """Become the reader if nobody reads; the caller must `step_down` after."""
        with self._lock:
            if self._reading:
                return False
            self._reading = True
            return True

    def step_down(self) -> None:
        with self._lock:
            self._reading = False
            if self._followers:  # one takes over the reading; all check their replies
                self._cond.notify_all()

    def wake_followers(self) -> None:
        """Tell the followers that replies were resolved (or the connection died)."""
        with self._lock:
            if self._followers:
                self._cond.notify_all()

    def _follow(self, future: Pending, timeout: float) -> None:
        """Wait while another thread reads, until it resolves `future` or steps down."""
        with self._lock:
            if self._reading and not future.done():
                self._followers += 1
                try:
                    self._cond.wait(timeout)
                finally:
                    self._followers -= 1
