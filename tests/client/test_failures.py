"""Failures: silent peers, refused connections, a killed server, authentication."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from client_helpers import Clients, Portal, PortalQueue, silent_server, wait_until
from shardq_harness import ShardqServer

from shardq.client import (
    AsyncQueue,
    AsyncWorker,
    AuthenticationFailed,
    CommandTimeout,
    Connection,
    ConnectionLost,
    JobOptions,
    Queue,
    Worker,
)
from shardq.client._connection import DEFAULT_TIMEOUT


def _queue(mode: str, url: str, **options: Any) -> tuple[Any, Callable[[], None]]:
    """A queue for `url` outside `Clients` (no nudger, no shared server); and its closer."""
    if mode == "sync":
        queue = Queue("q", url=url, **options)
        return queue, queue.close
    portal = Portal()
    view = PortalQueue(portal, AsyncQueue("q", url=url, **options))

    def close() -> None:
        view.close()
        portal.close()

    return view, close


def test_command_timeout_raises(transport: str, mode: str) -> None:
    timeout = 0.3
    with silent_server(transport) as url:
        queue, close = _queue(mode, url, timeout=timeout, retry=None)
        try:
            started = time.monotonic()
            with pytest.raises(CommandTimeout):
                queue.add("never", None)
            # The configured timeout, not the default (10 s, over 30 times it: the room a
            # loaded machine's stalls get) nor no timeout at all.
            took = time.monotonic() - started
            assert timeout <= took < DEFAULT_TIMEOUT, f"a command timeout took {took:.2f} s"
            with pytest.raises(CommandTimeout):  # and again, on the same connection
                queue.counts()
        finally:
            close()


def _refused_port() -> int:
    """A port below the ephemeral range that refuses connections. (A free port *in* that
    range can, rarely, connect to itself: ZeroMQ's reconnects eventually hit TCP's
    simultaneous open, and a DEALER happily handshakes with itself.)"""
    for port in range(1, 1024):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise AssertionError("every port below 1024 accepts connections")


def test_unreachable_server_is_connection_lost(transport: str, mode: str) -> None:
    port = _refused_port()
    queue, close = _queue(mode, f"{transport}://127.0.0.1:{port}", connect_timeout=2.0)
    try:
        started = time.monotonic()
        with pytest.raises(ConnectionLost) as info:
            queue.add("x", None)  # retried (never sent), then given up
        assert info.value.sent is False
        assert time.monotonic() - started < 5
    finally:
        close()


# The kill -9 tests run once per transport and client kind; each kills the server and starts
# it again (same ports, same data), so the next case can take it as it is left instead of
# starting one of its own: queues and workers are each case's own, and so is the connection
# whose reconnects a case counts.
@pytest.fixture(scope="module")
def kill9_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    with ShardqServer(tmp_path_factory.mktemp("kill9") / "data", shards=2).start() as server:
        yield server


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    data = tmp_path_factory.mktemp("auth") / "data"
    with ShardqServer(data, env={"AUTH_TOKENS": "s3cret,other"}).start() as server:
        yield server


def _running(server: ShardqServer) -> ShardqServer:
    """`server`, started again if a case before this one left it killed (it failed between
    its kill and its restart)."""
    if server.returncode is not None:
        server.start()
    return server


def test_reconnect_after_kill9_and_restart(
    kill9_server: ShardqServer, make_clients: Callable[[ShardqServer], Clients]
) -> None:
    server = _running(kill9_server)
    clients = make_clients(server)
    queue = clients.queue()
    fast_retry = JobOptions(backoff_ms=10)  # recovered jobs retry after ~20 ms, not ~2 s
    first = queue.add_bulk([("n", i, fast_retry) for i in range(40)])
    done: set[str] = set()
    lock = threading.Lock()

    def handler(job: Any) -> None:
        time.sleep(0.01)
        with lock:
            done.add(job.id)

    worker = clients.worker(queue.name, handler, concurrency=4).start()
    wait_until(lambda: len(done) >= 5, 10, "some jobs to complete before the kill")

    server.kill9_tree()
    server.start()  # same ports, same data
    second = queue.add_bulk([("n", i, fast_retry) for i in range(40, 80)])  # reconnects

    counts = queue.wait_until_finished(timeout=30)
    # The restarted server knows nothing of the worker: it registered again on reconnecting.
    owner = getattr(worker, "async_worker", worker).config.owner
    wait_until(lambda: owner in list_workers(clients.url), 10, "the worker to register again")
    worker.close()
    assert counts.completed == 80 and counts.failed == 0
    assert set(first + second) <= done
    assert queue.connection.generation == 2, "one reconnect, then the same connection"


def list_workers(url: str) -> set[str]:
    with Connection(url, timeout=5.0) as conn:
        return {w["id"] for w in conn.call({"cmd": "ListWorkers"})["data"]["workers"]}


def test_auth_token_is_sent_on_every_connect(
    auth_server: ShardqServer, make_clients: Callable[[ShardqServer], Clients]
) -> None:
    server = _running(auth_server)
    clients = make_clients(server)
    anonymous = clients.queue(retry=None)
    with pytest.raises(AuthenticationFailed, match="Not authenticated"):
        anonymous.add("x", None)
    wrong = clients.queue(token="nope")
    with pytest.raises(AuthenticationFailed, match="Invalid token"):
        wrong.counts()

    queue = clients.queue(token="s3cret")
    queue.add_bulk([("n", i) for i in range(5)])
    stats = clients.worker(queue.name, lambda job: None, token="other").run_until_idle(10)
    assert stats.processed == 5

    server.kill9_tree()
    server.start()
    assert queue.counts().completed == 5, "Auth again after the reconnect"


def test_worker_stops_on_a_permanent_error(server: ShardqServer, transport: str, mode: str) -> None:
    url = (
        f"tcp://{server.host}:{server.tcp_port}"
        if transport == "tcp"
        else f"zmq://{server.host}:{server.zmq_port}"
    )
    bad = "bad queue name!"  # refused by PULLB's queue-name check, not transient
    if mode == "sync":
        with pytest.raises(Exception, match="invalid characters"):
            Worker(bad, lambda job: None, url=url).run()
        return
    portal = Portal()
    try:
        with pytest.raises(Exception, match="invalid characters"):
            portal.call(AsyncWorker(bad, lambda job: None, url=url).run())
    finally:
        portal.close()
