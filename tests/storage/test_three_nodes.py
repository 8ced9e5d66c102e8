"""Three real `shardq start` nodes on one PostgreSQL database, used through different nodes
at once (docs/cluster.md): durable pushes through node A, reads through node B, pulls and
ACKs through node C, every command for another node's queue forwarded to its owner.

- `kill -9` of B mid-load: every queue is served again by the survivors within a lease and a
  round, and a full drain keeps the ledger: every acknowledged push is delivered, and no job
  whose ACK was answered is delivered again.
- SIGTERM of a node under a steady stream of reads: the longest time any of its queues goes
  unanswered stays within one lease renewal round, plus the load's slack on this machine.

Short leases (1500 ms) keep each test to seconds. Deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, poll_until

from shardq.client import ConnectionLost, TcpConnection

NEEDS_POSTGRES = True
LEASE_MS = 1500
ROUND_S = LEASE_MS / 3000  # one renewal round
PARTS = 12
QUEUES = [f"n3q{i}" for i in range(12)]
ANY_QUEUES = [f"n3any{i}" for i in range(12)]  # the any-node check's, apart from the hand-over's
PUSHES = 240  # acknowledged durable pushes before the producer stops
# What a busy 2-core machine adds to a hand-over: the survivor's load and its first answer.
SLACK_S = 1.5
# Answers a client retries: a partition being loaded or between owners, or forwarded to a
# node that just died.
RETRIED = ("Partition unavailable", "Node unavailable", "Node busy")


def _node(tmp: Path, name: str, url: str, head_jobs: int = 0) -> ShardqServer:
    settings = {"SHARDQ_STORAGE_URL": url, "SHARDQ_LEASE_MS": str(LEASE_MS),
                "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name,
                "SHARDQ_ENGINE_HEAD_JOBS": str(head_jobs)}  # fmt: skip
    return ShardqServer(tmp / name, shards=1, env=settings)


def _held(url: str) -> dict[str, int]:
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT owner, count(*) FROM partition_leases WHERE expires_at > now() GROUP BY owner"
        ).fetchall()
    return {str(owner): int(n) for owner, n in rows}


@pytest.fixture
def three(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[list[ShardqServer], str]]:
    """Nodes a, b, c started on a database of their own, sharing the partitions; with a
    head budget of `request.param` jobs per queue if the test asks for one."""
    url = new_database("n3")
    head_jobs = int(getattr(request, "param", 0))
    nodes = [_node(tmp_path, name, url, head_jobs) for name in ("a", "b", "c")]
    try:
        for node in nodes:
            node.start()
        poll_until(
            lambda: sorted(_held(url).values()) == [PARTS // 3] * 3,
            8 * ROUND_S + 5,
            "the three nodes to share the partitions",
            detail=lambda: str(_held(url)),
        )
        yield nodes, url
    finally:
        for node in nodes:
            node.close()


def call(conn: TcpConnection, cmd: dict[str, Any], timeout: float = 15.0) -> dict[str, Any]:
    """`cmd` through `conn`, retrying the answers of a hand-over (`RETRIED`) until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        reply = conn.call(cmd, check=False)
        if not str(reply.get("error", "")).startswith(RETRIED):
            return reply
        if time.monotonic() >= deadline:
            raise AssertionError(f"{cmd['cmd']} still refused after {timeout} s: {reply}")
        time.sleep(0.02)


class Ledger:
    """What the clients were told: pushes acknowledged, deliveries, ACKs answered."""

    def __init__(self) -> None:
        self.pushed: set[str] = set()
        self.delivered: list[str] = []
        self.acked: dict[str, int] = {}  # job id -> index in `delivered` of its answered ACK
        self.lock = threading.Lock()

    def check(self) -> None:
        assert self.pushed <= set(self.delivered), len(self.pushed - set(self.delivered))
        for job_id, at in self.acked.items():
            again = [i for i, d in enumerate(self.delivered) if d == job_id and i > at]
            assert not again, f"{job_id} delivered again after its ACK was answered"


def _produce(node: ShardqServer, ledger: Ledger, stop: threading.Event) -> None:
    with TcpConnection(*node.tcp_address, timeout=10) as conn:
        i = 0
        while not stop.is_set() and len(ledger.pushed) < PUSHES:
            cmd = {"cmd": "PUSH", "queue": QUEUES[i % len(QUEUES)], "data": {"i": i},
                   "durable": True}  # fmt: skip
            i += 1
            reply = conn.call(cmd, check=False)
            if reply.get("ok"):
                with ledger.lock:
                    ledger.pushed.add(reply["id"])


def _consume_one(conn: TcpConnection, queue: str, ledger: Ledger) -> bool:
    got = conn.call({"cmd": "PULL", "queue": queue, "owner": "n3", "timeout": 0}, check=False)
    job = got.get("job") if got.get("ok") else None
    if job is None:
        return False
    with ledger.lock:
        ledger.delivered.append(job["id"])
        at = len(ledger.delivered) - 1
    ack = conn.call({"cmd": "ACK", "id": job["id"], "token": got["token"]}, check=False)
    if ack.get("ok"):
        with ledger.lock:
            ledger.acked[job["id"]] = at
    return True


def _consume(node: ShardqServer, ledger: Ledger, stop: threading.Event) -> None:
    with TcpConnection(*node.tcp_address, timeout=10) as conn:
        while not stop.is_set():
            if not any([_consume_one(conn, q, ledger) for q in QUEUES]):
                time.sleep(0.01)


def _read(node: ShardqServer, ledger: Ledger, stop: threading.Event, found: list[int]) -> None:
    with TcpConnection(*node.tcp_address, timeout=10) as conn:
        while not stop.is_set():
            with ledger.lock:
                sample = list(ledger.pushed)[-5:]
            for job_id in sample:
                try:
                    reply = conn.call({"cmd": "GetJob", "id": job_id}, check=False)
                except ConnectionLost:
                    return  # this reader's node was the one killed
                if reply.get("ok") and reply.get("job"):
                    found[0] += 1
            time.sleep(0.02)


def _served_all(conn: TcpConnection) -> bool:
    for queue in QUEUES:
        reply = conn.call({"cmd": "GetJobCounts", "queue": queue}, check=False)
        if not reply.get("ok"):
            return False
    return True


# With a head of 2 jobs per queue the consumer starts only after the kill, so b's queues hold
# cold jobs, in PostgreSQL only, when it dies: the survivors' takeover loads restore their
# cold counts and page them in.
@pytest.mark.parametrize("three", [0, 2], indirect=True, ids=["in-memory", "head-2"])
def test_three_nodes_kill_9_of_one_mid_load_loses_nothing_acknowledged(
    three: tuple[list[ShardqServer], str], request: pytest.FixtureRequest
) -> None:
    (a, b, c), url = three
    head_jobs = int(request.node.callspec.params["three"])
    ledger, stop, found = Ledger(), threading.Event(), [0]
    threads = [
        threading.Thread(target=_produce, args=(a, ledger, stop), daemon=True),
        threading.Thread(target=_read, args=(b, ledger, stop, found), daemon=True),
        threading.Thread(target=_consume, args=(c, ledger, stop), daemon=True),
    ]
    for t in threads[:2] if head_jobs else threads:
        t.start()
    try:
        poll_until(lambda: len(ledger.pushed) >= PUSHES // 3, 30, "pushes through node a")
        assert found[0] > 0, "reads through node b found no pushed job"
        threads[1].join(0)  # the reader dies with b; the others go on
        b.kill9_tree()
        killed = time.monotonic()
        if head_jobs:
            threads[2].start()
        with TcpConnection(*c.tcp_address, timeout=10) as conn:
            poll_until(lambda: _served_all(conn), LEASE_MS / 1000 + ROUND_S + SLACK_S + 5,
                       "every queue served by the survivors")  # fmt: skip
        served = time.monotonic() - killed
        print(f"kill -9 of b: every queue served again after {served * 1000:.0f} ms")
        assert served < LEASE_MS / 1000 + ROUND_S + SLACK_S
        poll_until(lambda: len(ledger.pushed) >= PUSHES, 60, "the rest of the pushes")
    finally:
        stop.set()
        for t in threads:
            if t.ident is not None:  # started
                t.join(15)
    assert sorted(_held(url).values()) == [PARTS // 2] * 2
    # The full drain, through c, until every queue is empty. A job that was active on b
    # comes back as a retry, delayed by its backoff: the drain waits for it.
    with TcpConnection(*c.tcp_address, timeout=10) as conn:

        def drained() -> bool:
            while any([_consume_one(conn, q, ledger) for q in QUEUES]):
                pass
            counts = [call(conn, {"cmd": "GetJobCounts", "queue": q})["counts"] for q in QUEUES]
            return all(n["waiting"] == n["active"] == n["delayed"] == 0 for n in counts)

        poll_until(drained, 30, "every queue drained through node c")
    ledger.check()
    if head_jobs:
        # The survivors' takeover loads found b's queues with cold jobs, and restored them.
        restored = [line["cold_jobs"] for n in (a, c) for line in n.logs(strict=False)
                    if line.get("event") == "cold backlog restored"]  # fmt: skip
        assert max(restored) > 0, restored


def _any_node_pushes_and_reads(nodes: list[ShardqServer]) -> None:
    """Through each node, a push for every queue of `ANY_QUEUES` lands at its owner and reads
    back anywhere."""
    ids = []
    for node in nodes:
        with TcpConnection(*node.tcp_address, timeout=10) as conn:
            for queue in ANY_QUEUES:
                reply = call(conn, {"cmd": "PUSH", "queue": queue, "data": {}})
                assert reply.get("ok") is True, (node.data_dir.name, queue, reply)
                ids.append(reply["id"])
    for node in nodes:
        with TcpConnection(*node.tcp_address, timeout=10) as conn:
            for job_id in ids:
                assert call(conn, {"cmd": "GetJob", "id": job_id})["job"]["id"] == job_id


def test_any_node_pushes_to_and_reads_from_every_queue_and_a_sigterm_hands_over_in_a_round(
    three: tuple[list[ShardqServer], str],
) -> None:
    """Two checks on one cluster (a three-node start is the costliest part of each): first
    every node serves every queue (`_any_node_pushes_and_reads`, on queues of its own), then
    the SIGTERM of b under a steady stream of reads through c."""
    (a, b, c), url = three
    _any_node_pushes_and_reads([a, b, c])
    with TcpConnection(*a.tcp_address, timeout=10) as conn:
        for i, queue in enumerate(QUEUES):
            call(conn, {"cmd": "PUSH", "queue": queue, "data": {"i": i}, "durable": True})
    gaps: dict[str, float] = {}
    wrong: list[dict[str, Any]] = []
    stop = threading.Event()

    def watch() -> None:
        # Reads of every queue through c, round after round: the longest stretch a queue
        # answers nothing but hand-over errors is its gap.
        failing: dict[str, float] = {}
        with TcpConnection(*c.tcp_address, timeout=10) as conn:
            while not stop.is_set():
                for queue in QUEUES:
                    reply = conn.call({"cmd": "GetJobCounts", "queue": queue}, check=False)
                    now = time.monotonic()
                    if reply.get("ok"):
                        if queue in failing:
                            gap = now - failing.pop(queue)
                            gaps[queue] = max(gaps.get(queue, 0.0), gap)
                        if reply["counts"]["waiting"] != 1:
                            wrong.append(reply)
                    else:
                        failing.setdefault(queue, now)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        time.sleep(2 * ROUND_S)
        assert b.stop() == 0  # SIGTERM: flush, release, NOTIFY the others
        poll_until(lambda: sorted(_held(url).values()) == [PARTS // 2] * 2, 10,
                   "a and c to hold b's partitions")  # fmt: skip
        time.sleep(2 * ROUND_S)
    finally:
        stop.set()
        watcher.join(15)
    assert watcher.is_alive() is False
    assert not wrong, wrong[:3]  # each queue shows its one job on every side of the hand-over
    longest = max(gaps.values(), default=0.0)
    print(f"SIGTERM of b: longest gap {longest * 1000:.0f} ms over {len(gaps)} queues")
    assert longest <= ROUND_S + SLACK_S, gaps
