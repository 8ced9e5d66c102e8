"""`FdPoller`: pyzmq's `Poller` interface over plain descriptors, on `select.poll`.

A shard polls only plain descriptors (its links, the direct port's and handed-off connections,
its signal pipe), never a ZeroMQ socket. `zmq.Poller` polls those too, but every call pays for
ZeroMQ sockets it has none of: libzmq's `zmq_poll` first polls with a zero timeout (to look at
ZeroMQ sockets' own event flags) and only then sleeps, so each wait is two `poll` system calls,
and pyzmq converts the whole registration list to libzmq's items on every call. A sequential
durable push waits twice in its shard (for the request, for the writer's `done`): one system
call more per wait, on the request's path. `FdPoller` keeps one `select.poll` object, updated as
descriptors are registered, and makes one `poll` call per wait.

It keeps pyzmq's meanings so the callers' flags and tests do not change: flags are ZeroMQ's
(`zmq.POLLIN` 1, `zmq.POLLOUT` 2), registering with flags 0 unregisters, registering again
modifies, `unregister` of an unknown descriptor raises `KeyError`, a timeout is in milliseconds
(None or negative: wait until something comes), and the events returned are ZeroMQ's too (a hang
up or an error is `zmq.POLLERR`).
"""

from __future__ import annotations

import select
from typing import Final

import zmq

__all__ = ["FdPoller"]

_ZMQ_IN: Final = int(zmq.POLLIN)
_ZMQ_OUT: Final = int(zmq.POLLOUT)
_ZMQ_ERR: Final = int(zmq.POLLERR)
_ZMQ_PRI: Final = int(zmq.POLLPRI)


def _to_zmq(revents: int) -> int:
    out = 0
    if revents & select.POLLIN:
        out |= _ZMQ_IN
    if revents & select.POLLOUT:
        out |= _ZMQ_OUT
    if revents & select.POLLPRI:
        out |= _ZMQ_PRI
    if revents & ~(select.POLLIN | select.POLLOUT | select.POLLPRI):
        out |= _ZMQ_ERR  # POLLERR, POLLHUP, POLLNVAL: as libzmq reports them
    return out


# Every combination of the six classic poll bits, converted once (`poll` looks them up).
_REVENTS: Final = tuple(_to_zmq(r) for r in range(64))


def _to_select(flags: int) -> int:
    events = 0
    if flags & _ZMQ_IN:
        events |= select.POLLIN
    if flags & _ZMQ_OUT:
        events |= select.POLLOUT
    if flags & _ZMQ_PRI:
        events |= select.POLLPRI
    return events


# Every combination of ZeroMQ's four flags, converted once (`register` looks them up: pyzmq's
# flags are `enum.IntFlag` members, and `&` on one builds a new flag in Python).
_EVENTS: Final = tuple(_to_select(f) for f in range(16))


class FdPoller:
    """A poll over plain descriptors with `zmq.Poller`'s interface and flags."""

    __slots__ = ("_flags", "_poll")

    def __init__(self) -> None:
        self._poll = select.poll()
        self._flags: dict[int, int] = {}  # descriptor -> its ZeroMQ flags

    def __contains__(self, fd: int) -> bool:
        return fd in self._flags

    def register(self, fd: int, flags: int = _ZMQ_IN | _ZMQ_OUT) -> None:
        """Watch `fd` for `flags` (ZeroMQ's); again: change them; 0: unregister it."""
        if not flags:
            if fd in self._flags:
                self.unregister(fd)
            return
        if self._flags.get(fd) != flags:
            self._poll.register(fd, _EVENTS[flags])  # registering again modifies
            self._flags[fd] = flags

    def modify(self, fd: int, flags: int = _ZMQ_IN | _ZMQ_OUT) -> None:
        self.register(fd, flags)

    def unregister(self, fd: int) -> None:
        """Stop watching `fd`; KeyError if it is not watched."""
        del self._flags[fd]
        self._poll.unregister(fd)  # registered while in `_flags`: the two change together

    def poll(self, timeout: int | float | None = None) -> list[tuple[int, int]]:
        """Wait up to `timeout` ms (None or negative: until something comes) and return
        (descriptor, ZeroMQ events) for each one ready."""
        if timeout.__class__ is float:  # pyzmq truncates; `select.poll` would round up
            timeout = int(timeout)
        got = self._poll.poll(timeout)  # None or negative: no timeout, as pyzmq's
        if not got:
            return got
        table = _REVENTS
        return [(fd, table[revents] if revents < 64 else _to_zmq(revents)) for fd, revents in got]
