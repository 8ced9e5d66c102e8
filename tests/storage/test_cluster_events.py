"""Events on several nodes (docs/cluster.md "Events on several nodes"): three real `shardq
start` nodes on one PostgreSQL database.

A subscriber on node A (bunqueue's wire protocol, and shardq's client `Queue.on`) receives the
pushed, completed and failed events of jobs on queues node B holds; after B is stopped with
SIGTERM and its partitions pass to A and C, it goes on receiving the events of those queues
from their new owners. A subscriber that stops reading costs bounded memory on its node, and
so does a whole node that stops reading its peer's event link. A node joining under load
never makes another node answer with an address that refuses connections.

Short leases (1500 ms) keep each test to seconds. Deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import lease_owners, new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, free_port, poll_until
from wire_clients import Tcp

from shardq.client import Queue, QueueEvent, TcpConnection
from shardq.cluster import partition_of
from shardq.protocol import encode

NEEDS_POSTGRES = True
LEASE_MS = 1500
ROUND_S = LEASE_MS / 3000
PARTS = 12
RETRIED = ("Partition unavailable", "Node unavailable", "Node busy")
Reply = dict[str, Any]


def _node(tmp: Path, name: str, url: str, *, http: bool = False, **env: str) -> ShardqServer:
    settings = {"SHARDQ_STORAGE_URL": url, "SHARDQ_LEASE_MS": str(LEASE_MS),
                "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name,
                **env}  # fmt: skip
    return ShardqServer(tmp / name, shards=1, env=settings, http_port=free_port() if http else 0)


def _held(url: str) -> dict[str, int]:
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT owner, count(*) FROM partition_leases WHERE expires_at > now() GROUP BY owner"
        ).fetchall()
    return {str(owner): int(n) for owner, n in rows}


def _queues_of(url: str, node: str) -> list[str]:
    """One queue name for each partition `node` holds."""
    owners, seen, names = lease_owners(url), set(), []
    for i in range(100_000):
        name = f"ev{i}"
        part = partition_of(name, PARTS)
        if owners.get(part) == node and part not in seen:
            seen.add(part)
            names.append(name)
    return names


def _start(nodes: list[ShardqServer], url: str) -> None:
    for node in nodes:
        node.start()
    share = [PARTS // len(nodes)] * len(nodes)
    poll_until(lambda: sorted(_held(url).values()) == share, 8 * ROUND_S + 5,
               "the nodes to share the partitions", detail=lambda: str(_held(url)))  # fmt: skip


@pytest.fixture
def three(tmp_path: Path) -> Iterator[tuple[list[ShardqServer], str]]:
    url = new_database("ev3")
    nodes = [_node(tmp_path, name, url, http=name == "a") for name in ("a", "b", "c")]
    try:
        _start(nodes, url)
        yield nodes, url
    finally:
        for node in nodes:
            node.close()


def call(conn: TcpConnection, cmd: Reply, timeout: float = 15.0) -> Reply:
    """`cmd`, retrying the answers of a hand-over until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        reply = conn.call(cmd, check=False)
        if not str(reply.get("error", "")).startswith(RETRIED):
            return reply
        if time.monotonic() >= deadline:
            raise AssertionError(f"{cmd['cmd']} still refused after {timeout} s: {reply}")
        time.sleep(0.02)


class Sse:
    """The events of an SSE stream (`/events`), read by a thread of its own."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self.thread.start()
        assert self.connected.wait(10), "the SSE stream did not start"

    def _read(self, url: str) -> None:
        name = ""
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=60) as stream:
            self.connected.set()
            for raw in stream:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: ") and name:
                    self.events.append((name, json.loads(line.removeprefix("data: "))))

    def has(self, name: str, job_id: str) -> bool:
        return any(n == name and d.get("jobId") == job_id for n, d in list(self.events))


class Seen:
    """The events a wire subscriber got, read by a thread of its own once subscribed."""

    def __init__(self, sub: Tcp, subscribe: Reply) -> None:
        self.sub = sub
        assert sub.call({"cmd": "SubscribeEvents", **subscribe}) == {"ok": True}
        self.events: list[Reply] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stop.is_set():
            try:
                frame = self.sub.wait_unnamed(0.2)
            except TimeoutError:
                continue
            except OSError:
                return
            if frame.get("type") == "event":
                with self.lock:
                    self.events.append(frame["event"])

    def kinds(self, job_id: str) -> list[str]:
        with self.lock:
            return [e["eventType"] for e in self.events if e["jobId"] == job_id]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sub.close()


def _wait_kinds(seen: Seen, job_id: str, kinds: list[str], what: str) -> None:
    poll_until(lambda: all(k in seen.kinds(job_id) for k in kinds), 10, what,
               detail=lambda: str(seen.kinds(job_id)))  # fmt: skip


def _relayed(seen: Seen, conn: TcpConnection, queue: str) -> None:
    """Push to `queue` until the subscriber sees a push (its node subscribes on the peers
    as it subscribes: the first events may come before that)."""

    def one() -> bool:
        job = call(conn, {"cmd": "PUSH", "queue": queue, "data": {"probe": True}})["id"]
        time.sleep(0.1)
        return "pushed" in seen.kinds(job)

    poll_until(one, 10, f"the events of {queue} relayed")


def _run_job(conn: TcpConnection, queue: str, *, fail: bool = False) -> str:
    """Push a job to `queue`, pull it and ACK it (or FAIL it, with no retry); its id."""
    job_id = call(conn, {"cmd": "PUSH", "queue": queue, "data": {"n": 1}, "maxAttempts": 1})["id"]
    _finish(conn, queue, job_id, fail=fail, result={"done": queue})
    return job_id


def _finish(conn: TcpConnection, queue: str, job_id: str, *, fail: bool, result: Any) -> None:
    """Pull `queue` until `job_id` comes (ACKing the jobs before it), then ACK or FAIL it."""
    deadline = time.monotonic() + 15
    while True:  # a probe pushed before may come first
        got = call(conn, {"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 0})
        job = got.get("job")
        assert job is not None and time.monotonic() < deadline, got
        if job["id"] != job_id:
            call(conn, {"cmd": "ACK", "id": job["id"], "token": got["token"]})
            continue
        if fail:
            reply = call(conn, {"cmd": "FAIL", "id": job_id, "token": got["token"],
                                "error": "boom"})  # fmt: skip
        else:
            reply = call(conn, {"cmd": "ACK", "id": job_id, "token": got["token"],
                                "result": result})  # fmt: skip
        assert reply.get("ok") is True, reply
        return


def _wait_job(node: ShardqServer, job_id: str, out: list[Reply]) -> None:
    with TcpConnection(*node.tcp_address, timeout=40) as conn:
        reply = conn.call({"cmd": "WaitJob", "id": job_id, "timeout": 25_000}, check=False)
    reply.pop("reqId", None)
    out.append(reply)


def test_a_subscriber_on_a_gets_b_queues_events_and_keeps_them_after_b_stops(
    three: tuple[list[ShardqServer], str],
) -> None:
    (a, b, c), url = three
    b_queues = _queues_of(url, "b")
    assert len(b_queues) == PARTS // 3
    # bunqueue's protocol on node a: one subscriber for every queue, one for a single queue.
    every = Seen(Tcp(a.tcp_address), {"all": True})
    single = Seen(Tcp(a.tcp_address), {"queue": b_queues[0]})
    # shardq's client on node a, on b's first queue.
    got: list[QueueEvent] = []
    queue = Queue(b_queues[0], f"tcp://127.0.0.1:{a.tcp_port}")
    queue.on("*", got.append)
    # The HTTP port's SSE stream on node a, for every queue.
    sse = Sse(f"{a.http_url}/events")
    try:
        # The jobs run through node b itself: node a has no part in them but the events.
        with TcpConnection(*b.tcp_address, timeout=10) as on_b:
            for name in b_queues:
                _relayed(every, on_b, name)
            done = _run_job(on_b, b_queues[0])
            failed = _run_job(on_b, b_queues[0], fail=True)
        for seen in (every, single):
            _wait_kinds(seen, done, ["pushed", "pulled", "completed"], "b's completed job")
            _wait_kinds(seen, failed, ["pushed", "failed"], "b's failed job")
        poll_until(lambda: {(e.job_id, e.type) for e in got} >= {(done, "completed"),
                                                                 (failed, "failed")},
                   10, "shardq's client to get b's events")  # fmt: skip
        poll_until(lambda: sse.has("job:completed", done) and sse.has("job:failed", failed), 10,
                   "the SSE stream on a to get b's events")  # fmt: skip
        completed = next(e for e in got if e.job_id == done and e.type == "completed")
        assert completed.data == {"done": b_queues[0]} and completed.queue == b_queues[0]
        # Another queue's events are not the single subscriber's.
        assert {e["queue"] for e in single.events} == {b_queues[0]}

        # WaitJob (bunqueue's waitUntilFinished) through a on a job of b, parked on b when
        # b stops: it is asked again of the job's new owner and answers when it completes.
        waited: list[Reply] = []
        with TcpConnection(*a.tcp_address, timeout=30) as on_a:
            pending = call(on_a, {"cmd": "PUSH", "queue": b_queues[1], "data": {}})["id"]
        waiter = threading.Thread(target=_wait_job, args=(a, pending, waited), daemon=True)
        waiter.start()
        time.sleep(0.5)  # parked on b
        assert b.stop() == 0  # SIGTERM: b hands its partitions over to a and c
        poll_until(lambda: sorted(_held(url).values()) == [PARTS // 2] * 2, 10,
                   "a and c to hold b's partitions")  # fmt: skip
        with TcpConnection(*c.tcp_address, timeout=10) as on_c:
            _finish(on_c, b_queues[1], pending, fail=False, result=42)
        waiter.join(20)
        assert waited == [{"ok": True, "completed": True, "result": 42}], waited
        owners = lease_owners(url)
        new_owner = {q: owners[partition_of(q, PARTS)] for q in b_queues}
        assert set(new_owner.values()) == {"a", "c"}, new_owner  # both kinds of takeover
        after: dict[str, tuple[str, str]] = {}
        with TcpConnection(*c.tcp_address, timeout=10) as on_c:
            for name in b_queues:
                after[name] = (_run_job(on_c, name), _run_job(on_c, name, fail=True))
        for name, (ok_id, fail_id) in after.items():
            _wait_kinds(every, ok_id, ["pushed", "completed"], f"{name}'s events from "
                        f"{new_owner[name]} after the takeover")  # fmt: skip
            _wait_kinds(every, fail_id, ["pushed", "failed"], f"{name}'s failure")
        ok_id, fail_id = after[b_queues[0]]
        _wait_kinds(single, ok_id, ["pushed", "completed"], "the single queue's events")
        poll_until(lambda: (ok_id, "completed") in {(e.job_id, e.type) for e in got}, 10,
                   "shardq's client to get the events after the takeover")  # fmt: skip
        for ok_id, _ in after.values():
            poll_until(lambda i=ok_id: sse.has("job:completed", i), 10, "SSE after the takeover")
        print(f"after SIGTERM of b: {new_owner}")
    finally:
        queue.close()
        every.close()
        single.close()


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _flood(conn: TcpConnection, queue: str, rounds: int) -> None:
    """Jobs whose completed events carry 10 kB each: about 2 MB of events a round."""
    result = "x" * 10_000
    for _ in range(rounds):
        jobs = [{"data": {}} for _ in range(200)]
        assert call(conn, {"cmd": "PUSHB", "queue": queue, "jobs": jobs})["ok"]
        pulled = call(conn, {"cmd": "PULLB", "queue": queue, "count": 200, "owner": "w"})
        ids = [job["id"] for job in pulled["jobs"]]  # a probe pushed before may be among them
        results = [result] * len(ids)
        ack = {"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"], "results": results}
        assert call(conn, ack)["ok"]


def test_slow_readers_of_relayed_events_cost_bounded_memory(tmp_path: Path) -> None:
    url = new_database("ev2")
    # A burst (one shard turn: 200 completed events, 2 MB) passes to the peer link up to
    # 1 MiB, and to a client up to 64 KiB.
    small = {"SHARDQ_EVENTS_SUBSCRIBER_BUFFER_BYTES": "65536",
             "SHARDQ_EVENTS_PEER_BUFFER_BYTES": "1048576"}  # fmt: skip
    a, b = _node(tmp_path, "a", url, **small), _node(tmp_path, "b", url, **small)
    stuck = reader = None
    try:
        _start([a, b], url)
        name = _queues_of(url, "b")[0]
        # A subscriber on a that never reads, and one that does.
        stuck = socket.create_connection(a.tcp_address)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(encode({"cmd": "SubscribeEvents", "queue": name, "reqId": "s"}))
        reader = Seen(Tcp(a.tcp_address), {"queue": name})
        with TcpConnection(*b.tcp_address, timeout=30) as on_b:
            _relayed(reader, on_b, name)
            front_a = a.child_pids()["frontend"]
            before = _rss_bytes(front_a)
            _flood(on_b, name, 8)  # ~16 MB of events relayed to a
            grown_a = _rss_bytes(front_a) - before
            # Unbounded, a's front end would hold what the stuck subscriber never read.
            assert grown_a < 12 * 1024 * 1024, grown_a
            assert a.wait_for_log("events dropped for a slow subscriber", timeout=10)
            _relayed(reader, on_b, name)  # a subscriber that reads still gets events
            # Node a's front end stops reading its link to b: b bounds what it holds for it.
            front_b = b.child_pids()["frontend"]
            before = _rss_bytes(front_b)
            os.kill(front_a, signal.SIGSTOP)
            try:
                _flood(on_b, name, 24)  # 48 MB: far more than the kernel's buffers take
                grown_b = _rss_bytes(front_b) - before
            finally:
                os.kill(front_a, signal.SIGCONT)
            # Unbounded, b's would hold most of the 48 MB a did not read.
            assert grown_b < 16 * 1024 * 1024, grown_b
            assert b.wait_for_log("events dropped for a slow subscriber", timeout=10)
            # The link is still a subscription: events flow again once a reads (the first
            # ones may be dropped while the reader catches up with the backlog).
            _relayed(reader, on_b, name)
        print(f"stuck subscriber: a's front end grew {grown_a} B; a frozen: b's grew {grown_b} B")
    finally:
        if stuck is not None:
            stuck.close()
        if reader is not None:
            reader.close()
        for node in (a, b):
            node.close()
