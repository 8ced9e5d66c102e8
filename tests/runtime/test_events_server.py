"""Job events over the real server: SubscribeEvents on TCP and ZeroMQ (docs/protocol.md §18)."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
import zmq
from shardq_harness import ShardqServer, poll_until
from wire_clients import Dealer, Tcp

from shardq.protocol import encode

Reply = dict[str, Any]


def _events(sub: Tcp, count: int, timeout: float = 10.0) -> list[Reply]:
    """The next `count` event frames (frames without reqId) the subscriber gets."""
    deadline = time.monotonic() + timeout
    out: list[Reply] = []
    while len(out) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"got {len(out)} of {count} events: {out}")
        try:
            frame = sub.wait_unnamed(left)
        except TimeoutError:
            raise TimeoutError(f"got {len(out)} of {count} events: {out}") from None
        assert frame["type"] == "event", frame
        out.append(frame)
    return out


@pytest.fixture(scope="module")
def events_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """One two-shard server for the tests that subscribe to queues of their own (ev and
    other, fx, two: no test pushes to another's queue, and none subscribes to all queues)
    and change nothing server-wide. Started once instead of once per test; stopped cleanly
    (exit 0) at the end."""
    data = tmp_path_factory.mktemp("events") / "data"
    with ShardqServer(data, shards=2).start() as server:
        yield server
        assert server.stop() == 0, server.log_tail()


def _kinds(frames: list[Reply], job_id: str) -> list[str]:
    return [f["event"]["eventType"] for f in frames if f["event"]["jobId"] == job_id]


def test_subscriber_sees_a_jobs_lifecycle_in_order(events_server: ShardqServer) -> None:
    server = events_server
    sub, worker = Tcp(server.tcp_address), Tcp(server.tcp_address)
    try:
        assert sub.call({"cmd": "SubscribeEvents", "queue": "ev"}) == {"ok": True}
        job_id = worker.call({"cmd": "PUSH", "queue": "ev", "data": {"n": 1}})["id"]
        pulled = worker.call({"cmd": "PULL", "queue": "ev", "owner": "w1", "timeout": 0})
        token = pulled["token"]
        assert worker.call({"cmd": "Progress", "id": job_id, "progress": 50})["ok"]
        ack = {"cmd": "ACK", "id": job_id, "token": token, "result": {"r": 7}}
        assert worker.call(ack)["ok"]
        frames = _events(sub, 4)
        assert _kinds(frames, job_id) == ["pushed", "pulled", "progress", "completed"]
        ids = [f["id"] for f in frames]
        assert ids == sorted(ids) and len(set(ids)) == 4
        first = frames[0]["event"]
        assert first["queue"] == "ev" and isinstance(first["timestamp"], float)
        assert frames[2]["event"]["progress"] == 50
        assert frames[3]["event"]["data"] == {"r": 7}
        # Another queue's jobs are not this subscriber's.
        worker.call({"cmd": "PUSH", "queue": "other", "data": {}})
        assert sub.call({"cmd": "UnsubscribeEvents"}) == {"ok": True}
        worker.call({"cmd": "PUSH", "queue": "ev", "data": {}})
        assert sub.call({"cmd": "Ping"})["ok"]  # after the pushes' events would have come
        assert sub.unnamed == []
    finally:
        sub.close()
        worker.close()


def test_failed_retried_removed_and_duplicated(events_server: ShardqServer) -> None:
    server = events_server
    sub, c = Tcp(server.tcp_address), Tcp(server.tcp_address)
    try:
        assert sub.call({"cmd": "SubscribeEvents", "queue": "fx"})["ok"]
        job = c.call(
            {
                "cmd": "PUSH",
                "queue": "fx",
                "data": {},
                "maxAttempts": 2,
                "backoff": 0,
                "jobId": "k1",
            }
        )
        job_id = job["id"]
        token = c.call({"cmd": "PULL", "queue": "fx", "owner": "w", "timeout": 0})["token"]
        assert c.call({"cmd": "FAIL", "id": job_id, "token": token, "error": "boom"})["ok"]
        dup = c.call({"cmd": "PUSH", "queue": "fx", "data": {}, "jobId": "k1"})
        assert dup["id"] == job_id
        token = c.call({"cmd": "PULL", "queue": "fx", "owner": "w", "timeout": 0})["token"]
        assert c.call({"cmd": "FAIL", "id": job_id, "token": token, "error": "again"})["ok"]
        other = c.call({"cmd": "PUSH", "queue": "fx", "data": {}, "delay": 60_000})["id"]
        assert c.call({"cmd": "Cancel", "id": other})["ok"]
        later = c.call({"cmd": "PUSH", "queue": "fx", "data": {}, "delay": 60_000})["id"]
        assert c.call({"cmd": "MoveToWait", "id": later})["ok"]
        frames = _events(sub, 11)
        assert _kinds(frames, job_id) == [
            "pushed", "pulled", "failed", "retried", "duplicated", "pulled", "failed",
        ]  # fmt: skip
        failed = [f["event"] for f in frames if f["event"]["eventType"] == "failed"]
        assert [(e["error"], e["terminal"]) for e in failed] == [("boom", False), ("again", True)]
        assert _kinds(frames, other) == ["pushed", "removed"]
        removed = frames[-3]["event"]
        assert removed["prev"] == "delayed"
        assert _kinds(frames, later) == ["pushed", "waiting"]
        assert frames[-1]["event"]["prev"] == "delayed"
    finally:
        sub.close()
        c.close()


def test_two_subscribers_and_zeromq_get_the_same_events(events_server: ShardqServer) -> None:
    server = events_server
    ctx = zmq.Context()
    a, b, c = Tcp(server.tcp_address), Tcp(server.tcp_address), Tcp(server.tcp_address)
    dealer = Dealer(ctx, server.zmq_endpoint)
    try:
        for sub in (a, b):
            assert sub.call({"cmd": "SubscribeEvents", "queue": "two"})["ok"]
        assert dealer.call({"cmd": "SubscribeEvents", "queue": "two"})["ok"]
        ids = c.call({"cmd": "PUSHB", "queue": "two", "jobs": [{"data": {}}, {"data": {}}]})["ids"]
        got_a, got_b = _events(a, 2), _events(b, 2)
        assert [f["event"]["jobId"] for f in got_a] == ids
        assert got_a == got_b
        zmq_frames = [
            msgpack.unpackb(dealer.sock.recv_multipart()[-1], raw=False)
            for _ in range(2)
            if dealer.sock.poll(10_000)
        ]
        assert zmq_frames == got_a
    finally:
        for t in (a, b, c):
            t.close()
        dealer.close()
        ctx.term()


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_subscriber_that_never_reads_costs_bounded_memory(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(env={"SHARDQ_EVENTS_SUBSCRIBER_BUFFER_BYTES": "65536"})
    front = server.child_pids()["frontend"]
    stuck = socket.create_connection(server.tcp_address)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c = Tcp(server.tcp_address, timeout=30)
    try:
        stuck.sendall(encode({"cmd": "SubscribeEvents", "queue": "slow", "reqId": "s"}))
        c.call({"cmd": "Ping"})  # the subscription is in place once this round trip is over
        before = _rss_bytes(front)
        result = "x" * 10_000  # every completed event carries it: 30 MB of events in all
        started = time.monotonic()
        for _ in range(15):
            jobs = [{"data": {}} for _ in range(200)]
            ids = c.call({"cmd": "PUSHB", "queue": "slow", "jobs": jobs})["ids"]
            pulled = c.call({"cmd": "PULLB", "queue": "slow", "count": 200, "owner": "w"})
            ack = {"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"], "results": [result] * 200}
            assert c.call(ack)["ok"]
        elapsed = time.monotonic() - started
        grown = _rss_bytes(front) - before
        # Unbounded, the front end would hold the 30 MB the subscriber never read.
        assert grown < 12 * 1024 * 1024, grown
        assert elapsed < 60, elapsed
        assert server.wait_for_log("events dropped for a slow subscriber", timeout=10)
        # A reading subscriber is not held back by the stuck one.
        reader = Tcp(server.tcp_address)
        try:
            assert reader.call({"cmd": "SubscribeEvents", "queue": "slow"})["ok"]
            job = c.call({"cmd": "PUSH", "queue": "slow", "data": {}})["id"]
            assert _kinds(_events(reader, 1), job) == ["pushed"]
        finally:
            reader.close()
    finally:
        stuck.close()
        c.close()


def test_trim_all_queues_and_resume_with_a_gap(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=2)
    everything, c = Tcp(server.tcp_address), Tcp(server.tcp_address)
    try:
        assert everything.call({"cmd": "SubscribeEvents", "all": True})["ok"]
        ids = [c.call({"cmd": "PUSH", "queue": "tq", "data": {}})["id"] for _ in range(5)]
        other = c.call({"cmd": "PUSH", "queue": "tq2", "data": {}})["id"]
        seen = _events(everything, 6)
        assert {f["event"]["jobId"] for f in seen} == {*ids, other}
        trimmed = c.call({"cmd": "TrimEvents", "queue": "tq", "maxLength": 2})
        assert trimmed == {"ok": True, "data": {"removed": 3}}
        bad = c.call({"cmd": "TrimEvents", "queue": "tq", "maxLength": -1})
        assert bad == {"ok": False, "error": "maxLength must be a non-negative integer"}
        refused = c.call({"cmd": "SubscribeEvents", "queue": "no spaces"})
        assert refused == {"ok": False, "error": "Queue name contains invalid characters"}
        # Resuming from before the ring's oldest event: told so, then what the ring holds.
        late = Tcp(server.tcp_address)
        try:
            reply = late.call({"cmd": "SubscribeEvents", "queue": "tq", "since": 0})
            assert reply["ok"] and reply["gap"] is True
            assert reply["lastEventId"] == seen[-1]["id"]
            assert [f["event"]["jobId"] for f in _events(late, 2)] == ids[3:]
            resumed = late.call({"cmd": "SubscribeEvents", "queue": "tq", "since": seen[-1]["id"]})
            assert resumed["gap"] is False
        finally:
            late.close()
    finally:
        everything.close()
        c.close()


def test_a_restarted_shard_learns_who_listens(shardq_server: Callable[..., ShardqServer]) -> None:
    server = shardq_server()
    sub, c = Tcp(server.tcp_address), Tcp(server.tcp_address, timeout=60)
    try:
        assert sub.call({"cmd": "SubscribeEvents", "queue": "rq"})["ok"]
        old = server.child_pids()["shard-0"]
        os.kill(old, signal.SIGKILL)
        server.wait_child_replaced("shard-0", old, 60)

        def pushed() -> str | None:
            reply = c.call({"cmd": "PUSH", "queue": "rq", "data": {}})
            return str(reply["id"]) if reply.get("ok") else None

        job = poll_until(pushed, 30, "a push to the restarted shard")
        assert _kinds(_events(sub, 1), job) == ["pushed"]
    finally:
        sub.close()
        c.close()
