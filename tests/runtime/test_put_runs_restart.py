"""PUSHBs whose jobs go to the writer as runs (`putm`, `shardq.storage._encode`), the writer
killed with SIGKILL before their flush window's commit: the shard resends the batches, and
after a restart every job reads back exactly as it read before the kill, in every run (a
change of priority, delay or name cuts one) and between them.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
LONG_WINDOW = {"SHARDQ_FLUSH_INTERVAL_MS": "3000", "SHARDQ_FLUSH_MAX_MUTATIONS": "100000"}
QUEUES = ("runs-a", "runs-b")


def _pushes(conn: TcpConnection) -> list[str]:
    """PUSHBs of runs broken by priority, delay, name and options, then one more PUSHB and
    a durable one (which commits the window: both still only reach the writer resent)."""
    ids: list[str] = []
    mixed = [
        *[{"data": {"i": i}} for i in range(6)],
        *[{"data": {"p": i}, "priority": 4} for i in range(5)],
        *[{"data": {"d": i}, "delay": 60_000} for i in range(4)],
        *[{"data": {"n": i}, "name": "other"} for i in range(3)],
        {"data": {"o": 1}, "attempts": 3},
        *[{"data": {"i": i}} for i in range(6)],
    ]
    for queue in QUEUES:
        ids += conn.call({"cmd": "PUSHB", "queue": queue, "jobs": mixed})["ids"]
    return ids


def _jobs(conn: TcpConnection, ids: list[str]) -> list[Any]:
    replies = conn.call_many([{"cmd": "GetJob", "id": job_id} for job_id in ids], check=False)
    return [reply.get("job") for reply in replies]


def test_runs_of_pushed_jobs_resent_after_a_writer_kill_read_back_the_same(
    shardq_server: Factory,
) -> None:
    server = shardq_server(shards=1, env=LONG_WINDOW)
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        ids = _pushes(conn)
        before = _jobs(conn, ids)
        writer = server.child_pids()["writer"]
        os.kill(writer, signal.SIGKILL)  # answered, not committed: the window is 3 s long
        server.wait_child_replaced("writer", writer, 20)
        late = conn.call(
            {"cmd": "PUSHB", "queue": QUEUES[0], "jobs": [{"data": {"late": i}} for i in range(4)]}
        )["ids"]
        ids += late
        before += _jobs(conn, late)
        conn.call({"cmd": "PUSH", "queue": "runs-after", "data": {}, "durable": True})
    assert server.stop() == 0
    assert all(job is not None for job in before)
    assert len(before) == 2 * 25 + 4

    again = shardq_server(shards=1)
    with TcpConnection(*again.tcp_address, timeout=30) as conn:
        after = _jobs(conn, ids)
    assert again.stop() == 0
    for job_before, job_after in zip(before, after, strict=True):
        assert job_after == job_before
