"""PUSHBs and ACKBs on their one-pass paths (`FreshRecords.payload_jobs`, a checked ACKB's
`Consumer.complete_all`) in one flush window, the writer killed with SIGKILL before that
window's commit: the shard resends the batches, and after a restart every job reads back
exactly as it read before the kill (a mutation those paths forgot, or encoded differently,
shows as a job that differs).
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
QUEUE = "fused"


def _work(conn: TcpConnection) -> list[str]:
    """Two payload-only PUSHBs (one with named data), a PULLB, an ACKB of part of it, a
    PUSHB after it, the rest acknowledged: every job completed or waiting. Their ids."""
    ids: list[str] = []
    for jobs in (
        [{"data": {"i": i}} for i in range(30)],
        [{"data": {"i": i, "name": "named" if i % 3 else "other"}} for i in range(12)],
    ):
        ids += conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})["ids"]
    pulled = conn.call({"cmd": "PULLB", "queue": QUEUE, "count": 36, "owner": "w"})
    held = [job["id"] for job in pulled["jobs"]]
    conn.call({"cmd": "ACKB", "ids": held[:20], "tokens": pulled["tokens"][:20]})
    more = [{"data": {"late": i}} for i in range(5)]
    ids += conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": more})["ids"]
    conn.call({"cmd": "ACKB", "ids": held[20:], "tokens": pulled["tokens"][20:]})
    return ids


def _jobs(conn: TcpConnection, ids: list[str]) -> list[Any]:
    replies = conn.call_many([{"cmd": "GetJob", "id": job_id} for job_id in ids], check=False)
    return [reply.get("job") for reply in replies]


def test_fused_pushb_and_ackb_replayed_after_a_writer_kill_read_back_the_same(
    shardq_server: Factory,
) -> None:
    server = shardq_server(shards=1, env=LONG_WINDOW)
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        ids = _work(conn)
        before = _jobs(conn, ids)
        writer = server.child_pids()["writer"]
        os.kill(writer, signal.SIGKILL)  # answered, not committed: the window is 3 s long
        server.wait_child_replaced("writer", writer, 20)
        conn.call({"cmd": "PUSH", "queue": f"{QUEUE}-after", "data": {}, "durable": True})
    assert server.stop() == 0
    states = [job["state"] for job in before]
    assert states.count("completed") == 36 and states.count("waiting") == 11, states

    again = shardq_server(shards=1)
    with TcpConnection(*again.tcp_address, timeout=30) as conn:
        after = _jobs(conn, ids)
    assert again.stop() == 0
    for job_before, job_after in zip(before, after, strict=True):
        assert job_after == job_before
