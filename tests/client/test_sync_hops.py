"""What one request costs the blocking client, counted rather than timed (issue 24).

A lone caller writes its request and reads its reply in its own thread: no thread of the
transport is woken per request (the ZeroMQ transport once had an I/O thread that every
request crossed twice), and the socket is touched a fixed, small number of times. The counts
come from counting wrappers around the transport's socket and poll objects, so they do not
depend on the machine's load.
"""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from shardq_harness import ShardqServer

from bench.delay import calls_by_function
from shardq.client import Connection, ConnectionLost, Queue, _sync_transport

REQUESTS = 200


def url_of(server: ShardqServer, scheme: str) -> str:
    if scheme == "zmq":
        return "zmq" + server.zmq_endpoint.removeprefix("tcp")
    host, port = server.tcp_address
    return f"tcp://{host}:{port}"


class Counting:
    """Forwards every attribute to `inner`, counting the calls of its methods by name."""

    def __init__(self, inner: Any, counts: Counter[str], prefix: str) -> None:
        self._inner = inner
        self._counts = counts
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts[f"{self._prefix}.{name}"] += 1
            return value(*args, **kwargs)

        return counted


def _count(transport: Any, names: tuple[str, ...]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for name in names:
        setattr(transport, name, Counting(getattr(transport, name), counts, name))
    return counts


@pytest.mark.parametrize("scheme", ["tcp", "zmq"])
def test_a_blocking_connection_runs_no_thread_of_its_own(server: ShardqServer, scheme: str) -> None:
    before = set(threading.enumerate())
    with Queue(f"hops-{time.monotonic_ns()}", url=url_of(server, scheme)) as queue:
        for i in range(20):
            queue.add("n", {"i": i})
        started = set(threading.enumerate()) - before
        assert queue.counts().waiting == 20
    assert started == set(), f"the connection started {started}"


def test_tcp_request_is_one_send_one_poll_one_read(server: ShardqServer) -> None:
    with Connection(url_of(server, "tcp")) as conn:
        conn.call({"cmd": "Ping"})
        transport: Any = conn._transport
        # No Python-level timeout: CPython would poll before every send and every recv.
        assert transport._sock.gettimeout() is None
        stall = transport._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16)
        assert stall != bytes(16), "a send to a peer that stopped reading must still time out"
        counts = _count(transport, ("_sock", "_poll"))
        for _ in range(REQUESTS):
            conn.call({"cmd": "Ping"})
    # Per request: the liveness poll (no wait), one write, one read. The read blocks in
    # `recv` itself (its deadline is further off than the receive timeout): no poll first.
    assert counts["_sock.sendall"] == REQUESTS
    assert counts["_sock.recv_into"] == REQUESTS
    assert counts["_poll.poll"] == REQUESTS
    assert set(counts) <= {"_sock.sendall", "_sock.recv_into", "_poll.poll", "_sock.close",
                           "_sock.shutdown"}, counts  # fmt: skip


@pytest.mark.parametrize("fresh_s", [60.0, 0.0])
def test_direct_pushes_back_to_back_are_one_send_one_read(
    server: ShardqServer, monkeypatch: pytest.MonkeyPatch, fresh_s: float
) -> None:
    """A push on a shard's direct connection that wrote one less than `FRESH_S` ago skips the
    liveness poll: a write and a read. (`FRESH_S` is 1 ms; set here so that the count does
    not depend on how fast the machine answers.) Past it, the poll is back."""
    monkeypatch.setattr(_sync_transport, "FRESH_S", fresh_s)
    name = f"hops-direct-{time.monotonic_ns()}"
    with Connection(url_of(server, "tcp")) as conn:
        queue = Queue(name, connection=conn)
        queue.add("warm", {"i": 0})
        direct: Any = conn.direct
        assert direct is not None and direct.used == 1
        (transport,) = direct._open.values()
        counts = _count(transport, ("_sock", "_poll"))
        ids = [queue.add("job", {"i": i}) for i in range(REQUESTS)]
        assert direct.used == REQUESTS + 1, "every push went direct"
    assert counts["_sock.sendall"] == REQUESTS
    assert counts["_sock.recv_into"] == REQUESTS
    assert counts["_poll.poll"] == (0 if fresh_s else REQUESTS)
    with Queue(name, url=url_of(server, "tcp")) as check:
        for i, job_id in enumerate(ids):
            job = check.get_job(job_id)
            assert job is not None and job.data == {"i": i}
        assert check.counts().waiting == REQUESTS + 1


def test_zmq_request_touches_the_socket_a_few_times(server: ShardqServer) -> None:
    with Connection(url_of(server, "zmq")) as conn:
        conn.call({"cmd": "Ping"})
        transport: Any = conn._transport
        counting = _count(transport, ("_sock", "_monitor", "_poller", "_monitor_poll", "_wake_w"))
        for _ in range(REQUESTS):
            conn.call({"cmd": "Ping"})
        counts = counting.copy()  # (closing wakes a reader that might be waiting)
    # Per request: one send; a read that finds nothing before the wait (a send may have
    # taken the signal of a reply) and one that takes the reply; one wait; one look at
    # the monitor between requests. No wake-up of anyone through the socket pair.
    assert counts["_sock.send"] == REQUESTS
    assert counts["_sock.recv"] <= 2 * REQUESTS
    assert counts["_poller.poll"] <= REQUESTS + REQUESTS // 10  # a rare spurious wake-up
    assert counts["_monitor_poll.poll"] <= REQUESTS
    assert counts["_wake_w.send"] == 0 and counts["_monitor.recv_multipart"] == 0, counts


def test_a_tcp_reply_is_read_without_a_large_allocation(server: ShardqServer) -> None:
    """A fresh megabyte per read (once the read size) costs an mmap and a munmap."""
    with Connection(url_of(server, "tcp")) as conn:
        conn.call({"cmd": "Ping"})
        tracemalloc.start()
        try:
            for _ in range(50):
                conn.call({"cmd": "Ping"})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 64 * 1024, f"{peak} bytes at the peak of 50 pings"


@pytest.mark.parametrize("scheme", ["tcp", "zmq"])
def test_a_restart_between_requests_is_noticed_before_the_next_is_sent(
    shardq_server: Callable[..., ShardqServer], scheme: str
) -> None:
    """Nobody reads the socket between requests; the liveness look before a request (one
    poll, no wait) still sees the old connection gone, so a PUSH that must not be sent twice
    goes out on a new connection instead of failing, with no retry policy at all."""
    server = shardq_server(shards=1)
    with Connection(url_of(server, scheme), retry=None) as conn:
        conn.call({"cmd": "PUSH", "queue": "hops-restart", "data": {"n": 1}}, idempotent=False)
        server.kill9_tree()
        server.start()  # same ports
        deadline = time.monotonic() + 10
        while True:  # the restarted server may take a moment to accept
            try:
                reply = conn.call(
                    {"cmd": "PUSH", "queue": "hops-restart", "data": {"n": 2}}, idempotent=False
                )
                break
            except ConnectionLost as e:
                assert e.sent is False, "the PUSH was written to the dead connection"
                assert time.monotonic() < deadline, e
                time.sleep(0.1)
        assert reply["ok"] is True
        assert conn.generation >= 2


def _python_lock_entries(call: Callable[[], object], n: int) -> float:
    """`with` on a `threading.Condition` (a Python frame each) per `call()`, under cProfile."""
    return sum(
        count
        for (path, _line, name), count in calls_by_function(call, n).items()
        if name == "__enter__" and path.endswith("threading.py")
    )


@pytest.mark.parametrize("scheme", ["tcp", "zmq"])
def test_taking_turns_costs_a_request_no_python_level_lock(
    server: ShardqServer, scheme: str
) -> None:
    """The readers' turns (`_turns.Turns`) are taken with the plain lock, in C, and a reply
    lands in a `_turns.Pending`, which has no lock at all: 12 condition entries a request
    once, 6 with `concurrent.futures.Future` (its condition in `done`, `set_result` and
    `result`), none now."""
    with Connection(url_of(server, scheme)) as connection:
        queue = Queue("hops-locks", connection=connection)
        queue.add("warm", {"i": 0})
        per_request = _python_lock_entries(lambda: queue.add("job", {"i": 1}), REQUESTS)
    assert per_request == 0, per_request
