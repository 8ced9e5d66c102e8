"""A closed ZeroMQ connection must not wedge the client's ZeroMQ context.

libzmq reports socket events to the monitor with a blocking send from its I/O thread. A
monitor closed while its socket still reports (here: reconnect attempts to a dead port) would
block that thread for good, and every later connection of the process would fail with "no
handshake". The transports close through `close_monitored`, which detaches the monitor first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from shardq.client._url import parse_url
from shardq.client._zmq_sockets import (
    close_monitored,
    dealer_event,
    detach_monitor,
    handshake_failed,
    monitor_event,
    monitor_socket,
)

Context = zmq.Context[zmq.Socket[bytes]]
_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED


@pytest.fixture
def context() -> Iterator[Context]:
    ctx: Context = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def dead_port() -> int:
    probe = zmq.Context.instance().socket(zmq.ROUTER)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(linger=0)
    return port


def retrying_dealer(ctx: Context) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    """A DEALER that keeps retrying a dead port, and its monitor after the first retry."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 10)  # many retry events while the test waits
    monitor = monitor_socket(sock, _EVENTS)
    sock.connect(f"tcp://127.0.0.1:{dead_port()}")
    assert monitor.poll(5000), "no retry event from a dead port"
    monitor.recv_multipart()
    return sock, monitor


def still_delivers(ctx: Context) -> bool:
    """Whether a new DEALER on `ctx` still gets a message to a live ROUTER."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"ping")
        delivered = bool(router.poll(3000))
        dealer.close(linger=0)
        return delivered
    finally:
        router.close(linger=0)


def test_a_detached_monitor_lets_the_socket_keep_reporting(
    context: Context,
) -> None:
    sock, monitor = retrying_dealer(context)
    detach_monitor(sock, monitor)
    time.sleep(0.3)  # the socket retries about 30 times with nobody reading its monitor
    sock.close(linger=0)
    assert still_delivers(context), "the context's I/O thread is blocked"


def test_a_monitor_message_reads_as_pyzmq_reads_it(context: Context) -> None:
    # `monitor_event` replaces pyzmq's parser, whose module imports asyncio (and ssl).
    from zmq.utils.monitor import parse_monitor_message

    sock, monitor = retrying_dealer(context)
    assert monitor.poll(5000), "no second retry event"
    frames = monitor.recv_multipart()
    assert monitor_event(frames) == parse_monitor_message(frames)["event"]
    assert monitor_event(frames) == zmq.EVENT_CONNECT_RETRIED
    assert monitor_event([b"\x00\x40" + bytes(4), b"tcp://x"]) == 0x4000  # high event ids
    with pytest.raises(RuntimeError, match="Invalid event message"):
        monitor_event([b"short", b"tcp://x"])
    close_monitored(sock, monitor)


def test_close_monitored_leaves_the_context_usable(context: Context) -> None:
    for _ in range(20):
        sock, monitor = retrying_dealer(context)
        close_monitored(sock, monitor)
    assert still_delivers(context)


_AT = parse_url("zmq://127.0.0.1:6788")


@pytest.mark.parametrize(
    ("event", "handshaken", "expected"),
    [
        (zmq.EVENT_HANDSHAKE_SUCCEEDED, False, (True, None)),
        (zmq.EVENT_DISCONNECTED, True, (True, f"connection to {_AT} lost")),
        (zmq.EVENT_DISCONNECTED, False, (False, f"connection to {_AT} lost")),
        (zmq.EVENT_CONNECT_RETRIED, False, (False, f"connection to {_AT} refused")),
        (zmq.EVENT_CONNECT_RETRIED, True, (True, None)),  # ZeroMQ's own reconnect, later
        (zmq.EVENT_HANDSHAKE_FAILED_AUTH, False, (False, handshake_failed(_AT))),
        (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, True, (True, None)),
    ],
)
def test_both_transports_read_monitor_events_alike(
    event: int, handshaken: bool, expected: tuple[bool, str | None]
) -> None:
    """`dealer_event` is the one reading of a command DEALER's monitor, sync and asyncio."""
    assert dealer_event(event, handshaken, _AT) == expected
    assert "zmq_server_key" in handshake_failed(_AT)
