"""The front end and the shards as real processes (`shardq start --shards 2`), over raw TCP
frames and a raw ZeroMQ DEALER.

Most tests share one server (module scope) and use their own queues; tests that need a
different configuration or that stop the server start their own.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from shardq_harness import ShardqServer, poll_until
from wire_clients import Dealer, Tcp

from shardq.protocol import encode
from shardq.runtime._routing import shard_of
from shardq.storage import Store

N = 2


def queue_on(shard: int, prefix: str) -> str:
    """A queue name that `shard_of` puts on `shard` (of N)."""
    return next(f"{prefix}-{i}" for i in range(1000) if shard_of(f"{prefix}-{i}", N) == shard)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    # A short drain bound: a test that leaves a job active must not slow the teardown down.
    srv = ShardqServer(
        tmp_path_factory.mktemp("frontend-shard"), shards=N, env={"SHUTDOWN_TIMEOUT_MS": "3000"}
    )
    with srv.start():
        yield srv
        assert srv.stop() == 0, srv.log_tail()


@pytest.fixture
def connect(server: ShardqServer) -> Iterator[Callable[[], Tcp]]:
    opened: list[Tcp] = []

    def make() -> Tcp:
        client = Tcp(server.tcp_address)
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()


@pytest.fixture
def zctx() -> Iterator[zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)  # closes every socket left open, then terminates


def refused(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def round_trip(call: Callable[[dict[str, Any]], dict[str, Any]], queue: str) -> str:
    pushed = call({"cmd": "PUSH", "queue": queue, "data": {"n": 1}})
    assert pushed["ok"], pushed
    pulled = call({"cmd": "PULL", "queue": queue, "owner": "w1"})
    assert pulled["job"]["id"] == pushed["id"] and pulled["token"]
    acked = call({"cmd": "ACK", "id": pushed["id"], "token": pulled["token"], "result": "done"})
    assert acked == {"ok": True}
    job = call({"cmd": "GetJob", "id": pushed["id"]})["job"]
    assert (job["state"], job["returnvalue"]) == ("completed", "done")
    return str(pushed["id"])


def test_round_trip_over_tcp_on_both_shards(connect: Callable[[], Tcp]) -> None:
    client = connect()
    for shard in range(N):
        round_trip(client.call, queue_on(shard, "tcp"))
    queues = client.call({"cmd": "ListQueues"})["queues"]
    assert {queue_on(0, "tcp"), queue_on(1, "tcp")} <= set(queues)


@pytest.mark.parametrize("delimiter", [False, True], ids=["dealer", "dealer-with-delimiter"])
def test_round_trip_over_zeromq_on_both_shards(
    server: ShardqServer, zctx: zmq.Context[Any], delimiter: bool
) -> None:
    dealer = Dealer(zctx, server.zmq_endpoint, delimiter=delimiter)
    assert dealer.call({"cmd": "Hello"})["server"] == "bunqueue"
    for shard in range(N):
        round_trip(dealer.call, queue_on(shard, f"zmq{delimiter}"))
    assert dealer.call({"cmd": "Nope"}) == {"ok": False, "error": "Unknown command: Nope"}


def test_pipelined_replies_come_back_out_of_order(connect: Callable[[], Tcp]) -> None:
    client = connect()
    empty, busy = queue_on(0, "pipe-empty"), queue_on(1, "pipe")
    # One write: a long-poll that waits, then commands that are answered at once.
    reqs = client.send(
        {"cmd": "PULL", "queue": empty, "timeout": 400},
        *({"cmd": "PUSH", "queue": busy, "data": i} for i in range(20)),
        {"cmd": "Ping"},
    )
    replies = [client.wait(r) for r in reqs]
    assert replies[0] == {"ok": True, "job": None}
    assert all(r["ok"] and r["id"] for r in replies[1:-1])
    assert client.order[-1] == reqs[0]  # the long-poll was overtaken by everything after it
    assert len({r["id"] for r in replies[1:-1]}) == 20


def test_bulk_push_pull_ack(connect: Callable[[], Tcp]) -> None:
    client = connect()
    queue = queue_on(1, "bulk")
    ids = client.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": i} for i in range(100)]})
    assert len(ids["ids"]) == 100
    pulled = client.call({"cmd": "PULLB", "queue": queue, "count": 100, "owner": "w"})
    assert [j["id"] for j in pulled["jobs"]] == ids["ids"]
    other = queue_on(0, "bulk")
    one = client.call({"cmd": "PUSH", "queue": other, "data": "x"})["id"]
    extra = client.call({"cmd": "PULL", "queue": other, "owner": "w"})
    # One ACKB over jobs of both shards: split by the front end, recombined.
    acked = client.call(
        {
            "cmd": "ACKB",
            "ids": [*ids["ids"], one],
            "tokens": [*pulled["tokens"], extra["token"]],
            "results": list(range(101)),
        }
    )
    assert acked == {"ok": True}
    for q in (queue, other):
        counts = client.call({"cmd": "GetJobCounts", "queue": q})["counts"]
        assert counts["completed"] == (100 if q == queue else 1) and counts["active"] == 0


def test_durable_push_is_committed_when_answered(
    server: ShardqServer, connect: Callable[[], Tcp]
) -> None:
    client = connect()
    for shard in range(N):
        queue = queue_on(shard, "durable")
        job_id = client.call({"cmd": "PUSH", "queue": queue, "data": 1, "durable": True})["id"]
        bulk = client.call(
            {"cmd": "PUSHB", "queue": queue, "jobs": [{"data": 2}, {"data": 3, "durable": True}]}
        )["ids"]
        # Read straight after the reply: the rows must already be in SQLite.
        with Store.open(server.data_path) as store:
            for stored in (job_id, *bulk):
                record = store.get_job(stored)
                assert record is not None and record["queue"] == queue


def test_long_poll_is_answered_by_a_push(connect: Callable[[], Tcp]) -> None:
    waiter, producer = connect(), connect()
    queue = queue_on(1, "longpoll")
    (req,) = waiter.send({"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 10_000})
    with pytest.raises(TimeoutError):
        waiter.wait(req, timeout=0.2)
    started = time.monotonic()
    job_id = producer.call({"cmd": "PUSH", "queue": queue, "data": 1})["id"]
    reply = waiter.wait(req, timeout=5)
    # The pushed job, well before the poll's 10 s timeout (which answers no job): the push
    # woke it. Not a tighter bound: a loaded machine stalls a shard for seconds.
    assert reply["job"]["id"] == job_id and reply["token"]
    assert time.monotonic() - started < 5


def test_long_poll_times_out_empty(connect: Callable[[], Tcp]) -> None:
    client = connect()
    queue = queue_on(0, "timeout")
    started = time.monotonic()
    reqs = client.send(
        {"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 300},
        {"cmd": "PULLB", "queue": queue, "count": 5, "owner": "w", "timeout": 300},
        {"cmd": "PULLB", "queue": queue, "count": 5, "timeout": 300},
    )
    replies = [client.wait(r, timeout=5) for r in reqs]
    assert time.monotonic() - started >= 0.3
    assert replies == [
        {"ok": True, "job": None, "token": None},
        {"ok": True, "jobs": [], "tokens": []},
        {"ok": True, "jobs": []},
    ]


def test_close_releases_unrenewed_leases(connect: Callable[[], Tcp]) -> None:
    first, second = connect(), connect()
    queue = queue_on(1, "release")
    plain = first.call({"cmd": "PUSH", "queue": queue, "data": "plain"})["id"]
    renewed = first.call({"cmd": "PUSH", "queue": queue, "data": "renewed"})["id"]
    a = first.call({"cmd": "PULL", "queue": queue, "owner": "w1"})
    b = first.call({"cmd": "PULL", "queue": queue, "owner": "w1"})
    assert [a["job"]["id"], b["job"]["id"]] == [plain, renewed]
    assert first.call({"cmd": "JobHeartbeat", "id": renewed, "token": b["token"]})["ok"]
    first.close()

    def pulled_again() -> Any:
        return second.call({"cmd": "PULL", "queue": queue, "owner": "w2"})["job"]

    job = poll_until(pulled_again, 5, "the released job")
    assert job["id"] == plain and job["attempts"] == 0
    # The renewed lease stays with its worker (it may heartbeat from another connection).
    assert second.call({"cmd": "GetState", "id": renewed})["state"] == "active"
    assert second.call({"cmd": "ACK", "id": renewed, "token": b["token"]}) == {"ok": True}


def test_transport_errors(connect: Callable[[], Tcp]) -> None:
    client = connect()
    garbage = b"\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    client.send_raw(struct.pack(">I", len(garbage)) + garbage)
    assert client.wait_unnamed() == {"ok": False, "error": "Invalid command format"}
    client.send_raw(encode({"reqId": "no-cmd", "queue": "q"}))
    assert client.wait("no-cmd") == {"ok": False, "error": "Invalid command"}
    assert client.call({"cmd": "Foo"}) == {"ok": False, "error": "Unknown command: Foo"}
    assert client.call({"cmd": "Auth", "token": "x"}) == {"ok": False, "error": "Invalid token"}
    assert client.call({"cmd": "Ping"})["data"]["pong"] is True  # still open after all that


def test_oversize_frame_closes_the_connection(connect: Callable[[], Tcp]) -> None:
    client = connect()
    client.send_raw(struct.pack(">I", 64 * 1024 * 1024 + 1))
    assert client.wait_unnamed() == {
        "ok": False,
        "error": "Frame too large: 67108865 bytes exceeds maximum 67108864",
    }
    assert client.wait_eof()
    assert connect().call({"cmd": "Ping"})["ok"]  # the server itself is fine


def test_get_job_by_id_living_on_shard_1(connect: Callable[[], Tcp]) -> None:
    client = connect()
    queue = queue_on(1, "fanout")
    job_id = client.call({"cmd": "PUSH", "queue": queue, "data": {"k": "v"}})["id"]
    other = connect()  # a fresh connection; the front end routes by job id, not by connection
    assert other.call({"cmd": "GetJob", "id": job_id})["job"]["data"] == {"k": "v"}
    assert other.call({"cmd": "GetState", "id": job_id}) == {
        "ok": True,
        "id": job_id,
        "state": "waiting",
    }
    assert other.call({"cmd": "GetJob", "id": "no-such-job"}) == {
        "ok": False,
        "error": "Job not found",
    }


def test_wait_job(connect: Callable[[], Tcp]) -> None:
    waiter, worker = connect(), connect()
    queue = queue_on(0, "waitjob")
    job_id = worker.call({"cmd": "PUSH", "queue": queue, "data": 1})["id"]
    assert waiter.call({"cmd": "WaitJob", "id": "nope"}) == {"ok": False, "error": "Job not found"}
    assert waiter.call({"cmd": "WaitJob", "id": job_id, "timeout": 100}) == {
        "ok": True,
        "completed": False,
    }
    (req,) = waiter.send({"cmd": "WaitJob", "id": job_id, "timeout": 10_000})
    pulled = worker.call({"cmd": "PULL", "queue": queue, "owner": "w"})
    worker.call({"cmd": "ACK", "id": job_id, "token": pulled["token"], "result": [1, 2]})
    assert waiter.wait(req, timeout=5) == {"ok": True, "completed": True, "result": [1, 2]}


def test_stats_sum_over_shards(connect: Callable[[], Tcp]) -> None:
    client = connect()
    before = client.call({"cmd": "Stats"})["stats"]
    for shard in range(N):
        client.call({"cmd": "PUSH", "queue": queue_on(shard, "stats"), "data": 1, "delay": 60_000})
    after = client.call({"cmd": "Stats"})["stats"]
    assert after["delayed"] - before["delayed"] == N
    assert set(after) >= {"waiting", "active", "delayed", "dlq", "completed", "failed", "uptime"}


# -- servers of their own ------------------------------------------------------------------


def test_auth_gate_and_slowloris(
    shardq_server: Callable[..., ShardqServer], zctx: zmq.Context[Any]
) -> None:
    server = shardq_server(
        shards=N, env={"SHARDQ_AUTH_TOKENS": "s3cret", "SHARDQ_TCP_IDLE_TIMEOUT_MS": "300"}
    )
    client = Tcp(server.tcp_address)
    assert client.call({"cmd": "Ping"}) == {"ok": False, "error": "Not authenticated"}
    assert client.call({"cmd": "Auth", "token": "wrong"}) == {"ok": False, "error": "Invalid token"}
    assert client.call({"cmd": "Auth", "token": "s3cret"}) == {"ok": True}
    assert client.call({"cmd": "PUSH", "queue": "q", "data": 1})["ok"]
    dealer = Dealer(zctx, server.zmq_endpoint)
    assert dealer.call({"cmd": "Stats"}) == {"ok": False, "error": "Not authenticated"}
    assert dealer.call({"cmd": "Auth", "token": "s3cret"}) == {"ok": True}
    assert dealer.call({"cmd": "Stats"})["ok"]

    # Half a frame, then silence: cut after the idle timeout; an idle whole-frame peer is not.
    stalled = Tcp(server.tcp_address)
    stalled.send_raw(encode({"cmd": "Ping"})[:5])
    assert stalled.wait_eof(timeout=5)
    time.sleep(0.5)  # the one fixed wait: proving that nothing happens to an idle connection
    assert client.call({"cmd": "Auth", "token": "s3cret"}) == {"ok": True}
    assert server.find_log("connection dropped", reason="partial frame timeout") is not None
    client.close()
    assert server.stop() == 0


def test_fan_out_after_a_front_end_restart(shardq_server: Callable[..., ShardqServer]) -> None:
    server = shardq_server(shards=N)
    client = Tcp(server.tcp_address)
    queue = queue_on(1, "restart")
    job_id = client.call({"cmd": "PUSH", "queue": queue, "data": 7})["id"]
    client.close()
    os.kill(server.child_pids()["frontend"], signal.SIGKILL)

    def reconnected() -> Tcp | None:
        try:
            fresh = Tcp(server.tcp_address, timeout=1)
            fresh.call({"cmd": "Ping"}, timeout=1)
        except OSError:
            return None
        return fresh

    # The new front end has never seen the job: GetJob and ACK are asked of every shard.
    fresh = poll_until(reconnected, 10, "the restarted front end", detail=server.log_tail)
    assert fresh.call({"cmd": "GetJob", "id": job_id})["job"]["data"] == 7
    pulled = fresh.call({"cmd": "PULL", "queue": queue, "owner": "w"})
    assert fresh.call({"cmd": "ACK", "id": job_id, "token": pulled["token"]}) == {"ok": True}
    fresh.close()
    assert server.stop() == 0


def test_drain_on_sigterm(shardq_server: Callable[..., ShardqServer]) -> None:
    server = shardq_server(shards=N, env={"SHUTDOWN_TIMEOUT_MS": "10000"})
    worker, poller = Tcp(server.tcp_address), Tcp(server.tcp_address)
    busy, idle = queue_on(0, "drain"), queue_on(1, "drain")
    job_id = worker.call({"cmd": "PUSH", "queue": busy, "data": 1})["id"]
    token = worker.call({"cmd": "PULL", "queue": busy, "owner": "w"})["token"]
    (parked,) = poller.send({"cmd": "PULL", "queue": idle, "timeout": 30_000})
    server.signal(signal.SIGTERM)
    started = time.monotonic()
    # Draining: no new connections, the parked long-poll is answered empty and nothing more
    # is handed out...
    assert poller.wait(parked, timeout=5) == {"ok": True, "job": None}
    poll_until(lambda: refused(server.tcp_address), 5, "the listener to close")
    worker.call({"cmd": "PUSH", "queue": busy, "data": 2})
    assert worker.call({"cmd": "PULL", "queue": busy, "owner": "w"})["job"] is None
    # ... but the active job can still finish, which ends the drain long before the timeout.
    assert worker.call({"cmd": "ACK", "id": job_id, "token": token}) == {"ok": True}
    assert server.wait_exit(timeout=10) == 0
    assert time.monotonic() - started < 5


def test_drain_timeout_leaves_active_jobs_to_recovery(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=N, env={"SHUTDOWN_TIMEOUT_MS": "300"})
    worker = Tcp(server.tcp_address)
    queue = queue_on(1, "recover")
    job_id = worker.call({"cmd": "PUSH", "queue": queue, "data": 1})["id"]
    assert worker.call({"cmd": "PULL", "queue": queue, "owner": "w"})["job"]["id"] == job_id
    assert server.stop() == 0  # the job was never acked: the drain times out
    worker.close()
    again = shardq_server(shards=N, env={"SHUTDOWN_TIMEOUT_MS": "300"})
    client = Tcp(again.tcp_address)
    job = client.call({"cmd": "GetJob", "id": job_id})["job"]
    # Not released at the close (attempts would stay 0): recovered as a crash, attempts + 1.
    assert (job["state"], job["attempts"]) in {("waiting", 1), ("delayed", 1)}
    client.close()
    assert again.stop() == 0
