"""`FdPoller` (shardq/runtime/_fdpoll.py): pyzmq's `Poller` meanings over `select.poll`, on
real socket pairs. The shard's loop, its direct port and its handed-off connections rely on each
of them: ZeroMQ's flags in and out, flags 0 unregistering, a second register modifying,
`unregister` of an unknown descriptor raising `KeyError`, a hang-up reported as `POLLERR`."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import zmq

from shardq.runtime._fdpoll import FdPoller

IN, OUT, ERR = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.POLLERR)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_flags_in_and_out_are_zeromq_s(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    poller = FdPoller()
    poller.register(a.fileno(), IN)
    assert poller.poll(0) == []  # nothing to read: and no wait with a zero timeout
    b.send(b"x")
    assert poller.poll(0) == [(a.fileno(), IN)]
    poller.register(a.fileno(), IN | OUT)  # again: modifies
    assert poller.poll(0) == [(a.fileno(), IN | OUT)]
    poller.modify(a.fileno(), zmq.POLLOUT)  # pyzmq's IntFlag is taken as well
    assert poller.poll(0) == [(a.fileno(), OUT)]
    assert a.fileno() in poller


def test_flags_0_unregister_and_unknown_descriptors_raise(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    poller = FdPoller()
    poller.register(a.fileno(), IN)
    b.send(b"x")
    poller.modify(a.fileno(), 0)  # out of the poll, as with zmq.Poller
    assert a.fileno() not in poller
    assert poller.poll(0) == []
    poller.register(b.fileno(), 0)  # a new descriptor with no flags is ignored
    assert b.fileno() not in poller
    with pytest.raises(KeyError):
        poller.unregister(a.fileno())
    poller.register(a.fileno(), IN)
    poller.unregister(a.fileno())
    assert poller.poll(0) == []


def test_a_hang_up_is_pollerr_and_input(pair: tuple[socket.socket, socket.socket]) -> None:
    """A closed peer wakes the poll (the reader then finds the end of the stream), as libzmq
    reports it: POLLIN with the end's bytes, POLLERR for the hang-up."""
    a, b = pair
    poller = FdPoller()
    poller.register(a.fileno(), IN)
    b.close()
    ((fd, events),) = poller.poll(1000)
    assert fd == a.fileno() and events & IN and events & ERR
    assert a.recv(1) == b""


def test_a_timeout_returns_nothing_and_negative_waits_for_input(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    poller = FdPoller()
    poller.register(a.fileno(), IN)
    assert poller.poll(5) == []
    assert poller.poll(2.5) == []  # a float timeout, as pyzmq takes it
    b.send(b"x")
    assert poller.poll(-1) == [(a.fileno(), IN)]  # no timeout: returns on input
    assert poller.poll(None) == [(a.fileno(), IN)]
