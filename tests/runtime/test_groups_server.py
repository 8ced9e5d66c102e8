"""Job groups on the real server: two groups share a queue fairly (by the order of delivery), a
group concurrency cap is never exceeded (measured by the handlers themselves), a group rate
limit is never exceeded over 5 s, a paused group is skipped and its parked pull is served the
moment it resumes, and group settings survive a SIGTERM restart."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from shardq_harness import ShardqServer

from shardq.client import JobOptions, Queue, ServerError, TcpConnection

Factory = Callable[..., ShardqServer]
WAIT_S = 30.0
PARK_MS = 20_000  # a parked pull's own timeout


class Worker(threading.Thread):
    """Pulls one job at a time with a 10 s long-poll, runs `handle(job)`, ACKs; stops at `stop`
    (bounded: at most `max_jobs` jobs)."""

    def __init__(
        self,
        server: ShardqServer,
        queue: str,
        handle: Callable[[dict[str, Any]], None],
        max_jobs: int = 1000,
    ) -> None:
        super().__init__(daemon=True)
        self.conn = TcpConnection(*server.tcp_address, timeout=WAIT_S)
        self.queue, self.handle, self.max_jobs = queue, handle, max_jobs
        self.stop = threading.Event()
        self.jobs: list[dict[str, Any]] = []

    def run(self) -> None:
        while not self.stop.is_set() and len(self.jobs) < self.max_jobs:
            cmd = {"cmd": "PULL", "queue": self.queue, "owner": "w", "timeout": 10_000}
            reply: dict[str, Any] = self.conn.call(cmd)
            job = reply.get("job")
            if job is None:
                continue
            self.jobs.append(job)
            self.handle(job)
            self.conn.call({"cmd": "ACK", "id": job["id"], "token": reply["token"]})
        self.conn.close()


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """One single-shard server for the tests whose groups live in queues of their own (fair,
    capped, slow, p: every group setting, job and worker is one queue's). Started once
    instead of once per test; stopped cleanly (exit 0) at the end."""
    data = tmp_path_factory.mktemp("groups") / "data"
    with ShardqServer(data, shards=1).start() as server:
        yield server
        assert server.stop() == 0, server.log_tail()


def _push(conn: TcpConnection, queue: str, group: str, labels: list[str], **extra: Any) -> None:
    jobs = [{"data": {"label": label}, "groupId": group, **extra} for label in labels]
    reply = conn.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs})
    assert reply["ok"], reply


def _group(job: dict[str, Any]) -> str:
    return str(job["data"]["label"])[0]


def _wait_completed(conn: TcpConnection, queue: str, total: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"]["completed"] < total:
        assert time.monotonic() < deadline, f"{queue} did not drain"
        time.sleep(0.05)


def _stop(conn: TcpConnection, queue: str, workers: list[Worker]) -> None:
    for w in workers:
        w.stop.set()
    # one job per worker returns every parked pull
    conn.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": {"label": "z"}}] * len(workers)})
    for w in workers:
        w.join(WAIT_S)
        assert not w.is_alive()


def test_two_groups_share_a_queue_fairly(one_shard: ShardqServer) -> None:
    server = one_shard
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        # all of A is pushed before any of B: FIFO would serve 30 A first
        _push(conn, "fair", "A", [f"A{i}" for i in range(30)])
        host, port = server.tcp_address
        with Queue("fair", url=f"tcp://{host}:{port}") as queue:  # our client's group option
            for i in range(10):
                queue.add("b", {"label": f"B{i}"}, JobOptions(group_id="B", group_max_size=10))
            with pytest.raises(ServerError, match="Group B has reached its maximum size of 10"):
                queue.add("b", {"label": "B10"}, JobOptions(group_id="B", group_max_size=10))
        order: list[str] = []
        for _ in range(40):
            reply = conn.call({"cmd": "PULL", "queue": "fair", "owner": "w"})
            order.append(reply["job"]["data"]["label"])
            conn.call({"cmd": "ACK", "id": reply["job"]["id"], "token": reply["token"]})
    first = [label[0] for label in order[:20]]
    assert first == ["A", "B"] * 10  # strict turns while both groups have work
    assert order[20:] == [f"A{i}" for i in range(10, 30)]  # then A alone, still in order
    assert [label for label in order if label[0] == "B"] == [f"B{i}" for i in range(10)]


def test_a_group_concurrency_cap_is_never_exceeded(one_shard: ShardqServer) -> None:
    server = one_shard
    lock = threading.Lock()
    running = {"A": 0, "B": 0}
    peak = {"A": 0, "B": 0}

    def handle(job: dict[str, Any]) -> None:
        group = _group(job)
        if group not in running:
            return  # one of the ungrouped jobs that stop the workers
        with lock:
            running[group] += 1
            peak[group] = max(peak[group], running[group])
        time.sleep(0.03)
        with lock:
            running[group] -= 1

    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        for group, cap in (("A", 2), ("B", 1)):
            reply = conn.call(
                {
                    "cmd": "SetGroupConcurrency",
                    "queue": "capped",
                    "groupId": group,
                    "concurrency": cap,
                }
            )
            assert reply["ok"], reply
        _push(conn, "capped", "A", [f"A{i}" for i in range(30)])
        _push(conn, "capped", "B", [f"B{i}" for i in range(20)])
        workers = [Worker(server, "capped", handle) for _ in range(8)]
        for w in workers:
            w.start()
        _wait_completed(conn, "capped", 50)
        _stop(conn, "capped", workers)
    assert peak == {"A": 2, "B": 1}  # reached, never passed


def test_a_group_rate_limit_is_never_exceeded_over_five_seconds(one_shard: ShardqServer) -> None:
    server = one_shard
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        cmd = {"cmd": "SetGroupRateLimit", "queue": "slow", "groupId": "A", "max": 5}
        assert conn.call({**cmd, "duration": 1000})["ok"]
        _push(conn, "slow", "A", [f"A{i}" for i in range(100)])
        _push(conn, "slow", "B", [f"B{i}" for i in range(20)])
        workers = [Worker(server, "slow", lambda job: None) for _ in range(4)]
        for w in workers:
            w.start()
        time.sleep(5.0)
        # ungrouped jobs go first: they return the parked pulls without lifting the limit, so
        # every delivery of A, to the last, is under it
        _stop(conn, "slow", workers)
    jobs = [job for w in workers for job in w.jobs]
    assert sum(1 for job in jobs if _group(job) == "B") == 20  # the other group ran freely
    starts = sorted(int(job["startedAt"]) for job in jobs if _group(job) == "A")
    assert len([t for t in starts if t < starts[0] + 5000]) >= 20  # reopens on time: ~5/s
    for at in starts:
        assert sum(1 for t in starts if at <= t < at + 1000) <= 5


def test_a_paused_group_is_skipped_and_resuming_serves_a_parked_pull(
    one_shard: ShardqServer,
) -> None:
    server = one_shard
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        reply = conn.call({"cmd": "PauseGroup", "queue": "p", "groupId": "A"})
        assert reply["data"] == {"changed": True}
        _push(conn, "p", "A", ["A0"])
        _push(conn, "p", "B", ["B0"])
        reply = conn.call({"cmd": "PULLB", "queue": "p", "count": 10, "owner": "w"})
        assert [j["data"]["label"] for j in reply["jobs"]] == ["B0"]
        got: list[Any] = []
        with TcpConnection(*server.tcp_address, timeout=WAIT_S) as parked:

            def pull() -> None:
                got.append(parked.call({"cmd": "PULL", "queue": "p", "timeout": PARK_MS}))

            thread = threading.Thread(target=pull, daemon=True)
            sent_at = time.monotonic()
            thread.start()
            time.sleep(0.5)
            assert got == []  # parked: group A is paused
            assert conn.call({"cmd": "ResumeGroup", "queue": "p", "groupId": "A"})["data"] == {
                "changed": True
            }
            thread.join(WAIT_S)
        # Woken by the resume, not by the pull's own timeout (which would answer no job). The
        # bound is that timeout, counted from before the pull was sent: a stall of the server
        # or of this test only brings the answer nearer to it.
        took = time.monotonic() - sent_at
        assert took < PARK_MS / 1000, f"the parked pull waited out its timeout: {took:.1f} s"
        assert got[0]["job"]["data"]["label"] == "A0"


def test_group_settings_survive_a_restart(shardq_server: Factory) -> None:
    server = shardq_server(shards=2)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        base = {"queue": "kept"}
        conn.call({"cmd": "SetGroupConcurrency", **base, "groupId": "A", "concurrency": 1})
        conn.call({"cmd": "SetGroupRateLimit", **base, "groupId": "A", "max": 50, "duration": 9000})
        conn.call({"cmd": "PauseGroup", **base, "groupId": "B"})
        _push(conn, "kept", "A", ["A0", "A1", "A2"], durable=True)
        _push(conn, "kept", "B", ["B0"], durable=True)
    assert server.stop() == 0
    server.start()
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        base = {"queue": "kept"}
        concurrency = conn.call({"cmd": "GetGroupConcurrency", **base, "groupId": "A"})
        assert concurrency["data"] == {"concurrency": 1}
        limit = conn.call({"cmd": "GetGroupRateLimit", **base, "groupId": "A"})
        assert limit["data"] == {"limit": {"max": 50, "duration": 9000}}
        paused = conn.call({"cmd": "IsGroupPaused", **base, "groupId": "B"})
        assert paused["data"] == {"paused": True}
        assert conn.call({"cmd": "GetGroupsJobsCount", **base})["data"] == {"count": 4}
        reply = conn.call({"cmd": "PULLB", "queue": "kept", "count": 10, "owner": "w"})
        assert [j["data"]["label"] for j in reply["jobs"]] == ["A0"]  # cap 1, B paused
