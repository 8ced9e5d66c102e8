"""Signals as a file descriptor, so a process's one poll loop wakes up for them.

pyzmq retries a poll interrupted by a signal, so a loop blocked in `Poller.poll(None)` would
never notice SIGTERM on its own. `SignalWaker` installs `signal.set_wakeup_fd`: the C-level
handler writes each signal's number into a socket pair, and the loop polls the read end next
to its zmq sockets. Nothing runs inside the Python handler itself, so no state is touched at an
arbitrary point of the loop.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

__all__ = ["SignalWaker"]

_Handler = Callable[[int, FrameType | None], Any] | int | None


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    # A Python-level handler must exist for set_wakeup_fd to report the signal at all.
    return None


class SignalWaker:
    """Reports `signals` through `fileno()`; read them with `drain()`. Main thread only.

    Use as a context manager (or call `close()`) to restore the previous handlers.
    Raises `ValueError` if created outside the main thread (a `signal` module rule).
    """

    def __init__(self, signals: Iterable[signal.Signals]) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self._previous: dict[signal.Signals, _Handler] = {}
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        for signum in signals:
            self._previous[signum] = signal.signal(signum, _ignore)

    def fileno(self) -> int:
        """The descriptor to poll for POLLIN."""
        return self._read.fileno()

    def drain(self) -> list[int]:
        """The signals received since the last call, in arrival order (may be empty)."""
        received: list[int] = []
        while True:
            try:
                data = self._read.recv(256)
            except (BlockingIOError, InterruptedError):
                return received
            if not data:
                return received
            received.extend(data)

    def close(self) -> None:
        """Restore the previous handlers and wakeup fd, and close the socket pair."""
        for signum, handler in self._previous.items():
            # None: the previous handler was not installed from Python; the default is.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
        signal.set_wakeup_fd(self._previous_fd)
        self._read.close()
        self._write.close()

    def __enter__(self) -> SignalWaker:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
