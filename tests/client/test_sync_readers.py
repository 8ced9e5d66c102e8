"""The blocking transports (TCP and ZeroMQ) have no reader thread: the threads that wait read
for each other.

Whoever waits and finds nobody reading becomes the reader, resolves every reply that comes
(its own and other threads'), and hands over when its own are in. These tests share one
connection between many threads and check that every reply reaches its caller, in bounded
time, including when callers give up (timeouts) or the server goes away. Over ZeroMQ a caller
that finds the socket held by the reader leaves its request for the reader to send.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from shardq_harness import ShardqServer

from shardq.client import CommandTimeout, Connection, ConnectionLost, Queue

THREADS = 8
CALLS = 150


@pytest.fixture(params=["tcp", "zmq"])
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def url_of(server: ShardqServer, scheme: str) -> str:
    if scheme == "zmq":
        return "zmq" + server.zmq_endpoint.removeprefix("tcp")
    host, port = server.tcp_address
    return f"tcp://{host}:{port}"


def test_threads_sharing_a_connection_each_get_their_own_replies(
    server: ShardqServer, scheme: str
) -> None:
    with Queue(f"sr-{time.monotonic_ns()}", url=url_of(server, scheme)) as queue:

        def work(t: int) -> list[tuple[int, int]]:
            seen = []
            for i in range(CALLS):
                job_id = queue.add("n", {"t": t, "i": i})
                job = queue.get_job(job_id)
                assert job is not None
                seen.append((job.data["t"], job.data["i"]))
            return seen

        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(work, range(THREADS), timeout=120))
        for t, seen in enumerate(results):
            assert seen == [(t, i) for i in range(CALLS)]
        assert queue.counts().waiting == THREADS * CALLS
        assert queue.connection.generation == 1, "one connection all along"


def test_a_caller_that_gives_up_does_not_stall_the_others(
    server: ShardqServer, scheme: str
) -> None:
    """A long-poll that times out client-side must hand the reading over to the rest."""
    name = f"sr-{time.monotonic_ns()}"
    with (
        Connection(url_of(server, scheme), timeout=5.0) as conn,
        Queue(name, connection=conn) as queue,
    ):
        stop = threading.Event()

        def long_poll() -> None:
            while not stop.is_set():
                with pytest.raises(CommandTimeout):
                    # the server holds the pull 2 s; the client gives up after 0.2 s
                    conn.call({"cmd": "PULL", "queue": name + "-empty", "timeout": 2000},
                              timeout=0.2)  # fmt: skip

        poller = threading.Thread(target=long_poll)
        poller.start()
        try:
            started = time.monotonic()
            for i in range(200):
                queue.add("n", {"i": i})
            assert queue.counts().waiting == 200
            assert time.monotonic() - started < 20
        finally:
            stop.set()
            poller.join(10)
        assert not poller.is_alive()


def test_waiting_threads_fail_at_once_when_the_server_goes_away(
    shardq_server: Callable[..., ShardqServer], scheme: str
) -> None:
    server = shardq_server(shards=1)
    name = f"sr-{time.monotonic_ns()}"
    # A follower nobody wakes sleeps to its own deadline and only then finds its request
    # failed (ConnectionLost all the same): the waiters must end before `wait_s`, the bound that
    # tells the two apart, with all of it as the room a loaded machine gets.
    wait_s = 30.0
    with Connection(url_of(server, scheme), timeout=wait_s) as conn:
        conn.call({"cmd": "Ping"})
        errors: list[BaseException] = []

        def wait_for_a_job() -> None:
            try:
                conn.call({"cmd": "PULL", "queue": name, "timeout": 10000}, timeout=wait_s)
            except BaseException as e:
                errors.append(e)

        waiters = [threading.Thread(target=wait_for_a_job) for _ in range(4)]
        started = time.monotonic()  # before any waiter's deadline is set
        for w in waiters:
            w.start()
        time.sleep(0.3)  # all four are waiting: one reads, three follow
        server.kill9_tree()
        for w in waiters:
            w.join(wait_s + 10)
        assert not any(w.is_alive() for w in waiters)
        took = time.monotonic() - started
        assert took < wait_s, f"the waiters took {took:.1f} s: they woke at their timeout"
        assert len(errors) == 4 and all(isinstance(e, ConnectionLost) for e in errors), errors


def test_a_reader_that_leaves_hands_the_reading_over(server: ShardqServer, scheme: str) -> None:
    """A's wait ends (its own timeout) while B's reply is still to come: B must read it."""
    name = f"sr-{time.monotonic_ns()}"
    with (
        Connection(url_of(server, scheme), timeout=10.0) as conn,
        Queue(name, url=url_of(server, scheme)) as q,
    ):
        conn.call({"cmd": "Ping"})

        def a_gives_up() -> None:
            with pytest.raises(CommandTimeout):
                conn.call({"cmd": "PULL", "queue": name + "-empty", "timeout": 2000}, timeout=0.3)

        def push_once_a_left() -> None:
            a.join(30)
            q.add("late", {"n": 1})

        a = threading.Thread(target=a_gives_up)
        a.start()
        time.sleep(0.1)  # A reads now; B will wait for A
        pusher = threading.Thread(target=push_once_a_left)
        pusher.start()
        # B's reply comes only after A has given up. A follower wakes when the reader steps
        # down, or at its own deadline (then it raises CommandTimeout): B holding the job
        # means it took over the reading, whatever a loaded machine made the times.
        try:
            reply = conn.call({"cmd": "PULL", "queue": name, "timeout": 20_000}, timeout=30.0)
        except CommandTimeout:
            pytest.fail("B waited out its own timeout: nobody read its reply after A left")
        finally:
            pusher.join(30)
        assert not a.is_alive() and not pusher.is_alive()
        assert reply["job"]["name"] == "late"
        # Over ZeroMQ closing releases no lease: an active job would hold up the server's stop.
        conn.call({"cmd": "ACK", "id": reply["job"]["id"]})


def test_a_read_that_outlasts_the_receive_timeout_keeps_waiting(server: ShardqServer) -> None:
    """A TCP read whose deadline is further off than the socket's receive timeout (the connect
    timeout, 1 s here) blocks in `recv` with no poll first; the timeout ends that `recv` with
    nothing read, which is no loss: the reader reads again until its deadline."""
    name = f"sr-{time.monotonic_ns()}"
    with (
        Connection(url_of(server, "tcp"), timeout=10.0, connect_timeout=1.0) as conn,
        Queue(name, url=url_of(server, "tcp")) as q,
    ):
        conn.call({"cmd": "Ping"})
        pusher = threading.Timer(2.5, lambda: q.add("late", {"n": 1}))
        pusher.start()
        try:
            # Held by the server until the push, 2.5 s on: two receive timeouts pass.
            reply = conn.call({"cmd": "PULL", "queue": name, "timeout": 8000}, timeout=10.0)
        finally:
            pusher.join(5)
        assert reply["job"]["name"] == "late"
        assert conn.generation == 1, "the connection stayed up"
        conn.call({"cmd": "ACK", "id": reply["job"]["id"]})
