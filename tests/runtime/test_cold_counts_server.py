"""The cold counts a budgeted shard starts from, in a running server: exact across crashes.

A shard under a head budget starts from each queue's cold counts, which storage keeps in a
table of their own, written by triggers in the same transaction as the job rows
(`shardq.storage._cold_count_table`). Here a producer pushes (priorities, delays) and a
consumer takes jobs while the writer and then the shard are killed with SIGKILL; after a clean
stop the table must equal a count of the rows themselves, and the restarted server's
shard must start from exactly the table's counts, and its GetJobCounts must add up to the rows
and to what it answered before the restart.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardq_harness import ShardqServer, poll_until

from shardq.client import ConnectionClosed, ConnectionLost, TcpConnection
from shardq.storage import Storage, Store

Factory = Callable[..., ShardqServer]
HEAD = 100
ENV = {"SHARDQ_ENGINE_HEAD_JOBS": str(HEAD), "SHARDQ_ENGINE_STALL_CHECK_MS": "500"}
QUEUES = ("cc-plain", "cc-mixed")
PUSHES = 8000  # acknowledged pushes before the producer stops
WAIT_S = 30.0
RETRIED = ("Shard unavailable", "Storage unavailable", "Partition unavailable")
LIVE = ("waiting", "prioritized", "active", "delayed")  # GetJobCounts' states of a live job


def _entry(rng: random.Random, n: int, queue: str) -> dict[str, Any]:
    job: dict[str, Any] = {"data": {"n": n}, "priority": rng.choice((0, 0, 3)), "durable": True}
    if queue == "cc-mixed" and rng.random() < 0.2:
        job["delay"] = 3_600_000  # stays delayed through the test
    return job


def _produce(server: ShardqServer, pushed: list[str], stop: threading.Event) -> None:
    rng, n = random.Random(11), 0
    conn = TcpConnection(*server.tcp_address, timeout=WAIT_S)
    try:
        while not stop.is_set() and len(pushed) < PUSHES:
            queue = QUEUES[n // 25 % 2]
            jobs = [_entry(rng, n + k, queue) for k in range(25)]
            n += 25
            try:
                reply = conn.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs}, check=False)
            except (ConnectionLost, ConnectionClosed):
                conn.close()
                time.sleep(0.1)
                conn = TcpConnection(*server.tcp_address, timeout=WAIT_S)
                continue
            if reply.get("ok"):
                pushed.extend(reply["ids"])
            else:
                assert str(reply.get("error")).startswith(RETRIED), reply
                time.sleep(0.05)
    finally:
        conn.close()


def _consume(server: ShardqServer, stop: threading.Event) -> None:
    """Takes and acknowledges a few jobs now and then: cold rows leave the counts too."""
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        while not stop.is_set():
            for queue in QUEUES:
                try:
                    got = conn.call({"cmd": "PULLB", "queue": queue, "count": 5,
                                     "owner": "cc", "lockTtl": 1000}, check=False)  # fmt: skip
                    if got.get("ok") and got.get("jobs"):
                        ids = [j["id"] for j in got["jobs"]]
                        conn.call({"cmd": "ACKB", "ids": ids, "tokens": got["tokens"]}, check=False)
                except (ConnectionLost, ConnectionClosed):
                    return
            time.sleep(0.02)


def _cold_jobs(conn: TcpConnection) -> int:
    reply = conn.call({"cmd": "Stats"}, check=False)
    return int(reply["stats"]["coldJobs"]) if reply.get("ok") else 0


def _kill(server: ShardqServer, child: str) -> None:
    old = server.child_pids()[child]
    os.kill(old, signal.SIGKILL)
    server.wait_child_replaced(child, old, WAIT_S)


def _job_counts(conn: TcpConnection, queue: str) -> dict[str, int]:
    """GetJobCounts, retried while the queue's shard or partition is still loading."""
    deadline = time.monotonic() + WAIT_S
    while True:
        reply = conn.call({"cmd": "GetJobCounts", "queue": queue}, check=False)
        if reply.get("ok") or time.monotonic() > deadline:
            return dict(reply["counts"])
        assert str(reply.get("error")).startswith(RETRIED), reply
        time.sleep(0.1)


def _rows(store: Storage) -> dict[str, dict[str, int]]:
    """Waiting, active and delayed rows per queue, counted from the jobs table itself."""
    out = {q: {"waiting": 0, "delayed": 0, "active": 0, "prioritized": 0} for q in QUEUES}
    sql = "SELECT queue, state, count(*) FROM jobs"
    sql += " WHERE state IN ('waiting', 'delayed', 'active') GROUP BY queue, state"
    for queue, state, n in store._cold_rows("counting rows", sql, ()):  # type: ignore[attr-defined]
        out[queue][state] = int(n)
    return out


def _table_and_recount(store: Storage) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each queue's cold counts as the table holds them, and counted over the indexes."""
    table = {q: store.cold_counts(q) for q in QUEUES}
    store._counts_table = False  # type: ignore[attr-defined]  # as a schema before the table
    recount = {q: store.cold_counts(q) for q in QUEUES}
    store._counts_table = True  # type: ignore[attr-defined]
    return table, recount


def crash_scenario(start: Callable[[], ShardqServer], open_store: Callable[[], Storage]) -> None:
    """Push and consume through a kill -9 of the writer, then of the shard; stop; compare the
    counts table with a recount and the rows; restart; compare GetJobCounts. `start` starts
    a server on the same data each time (one shard, `ENV` in its environment), `open_store`
    opens its storage."""
    server = start()
    pushed: list[str] = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=_produce, args=(server, pushed, stop), daemon=True),
        threading.Thread(target=_consume, args=(server, stop), daemon=True),
    ]
    for t in threads:
        t.start()
    watch = TcpConnection(*server.tcp_address, timeout=WAIT_S)
    try:
        for child, share in (("writer", 2), ("shard-0", 4)):
            want = PUSHES * share // 6
            poll_until(lambda w=want: len(pushed) >= w and _cold_jobs(watch) > 0,
                       90, f"pushes and a cold backlog before the kill of {child}")  # fmt: skip
            _kill(server, child)
        poll_until(lambda: len(pushed) >= PUSHES, 90, "the rest of the pushes")
    finally:
        stop.set()
        for t in threads:
            t.join(WAIT_S)
    before = {q: _job_counts(watch, q) for q in QUEUES}
    watch.close()
    assert server.stop() == 0, server.log_tail()

    with open_store() as store:
        table, recount = _table_and_recount(store)
        rows = _rows(store)
    assert table == recount
    assert all(c.waiting for c in table.values()), table  # a cold backlog to count
    assert table["cc-mixed"].delayed and table["cc-plain"].prioritized, table

    server = start()
    cold = sum(c.waiting + c.delayed for c in table.values())

    def restored() -> int:
        # One line per load: at start, and on PostgreSQL per partitions the node gains.
        lines = server.logs(strict=False)
        return sum(int(line["cold_jobs"]) for line in lines
                   if line.get("event") == "cold backlog restored")  # fmt: skip

    poll_until(lambda: restored() == cold, 60, "the cold backlog restored", detail=server.log_tail)
    steps = server.find_log("shard load steps", role="shard-0")
    assert steps is not None and "cold_counts_ms" in steps and "load_jobs_ms" in steps, steps
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        after = {q: _job_counts(conn, q) for q in QUEUES}
    assert server.stop() == 0, server.log_tail()
    for queue in QUEUES:
        # A job whose pull died with a killed process comes back (waiting, or delayed by its
        # backoff) when its lock expires, at any moment: the jobs not yet finished are what
        # stays the same, in the server before and after the restart and in the rows.
        live = [sum(c[s] for s in LIVE) for c in (before[queue], after[queue], rows[queue])]
        assert live[0] == live[1] == live[2], (queue, before[queue], after[queue], rows[queue])


def test_cold_counts_stay_exact_through_kill_9_of_the_writer_and_the_shard(
    shardq_server: Factory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    crash_scenario(
        lambda: shardq_server(shards=1, data_dir=data, env=ENV),
        lambda: Store.open(data / "shardq.db"),
    )
