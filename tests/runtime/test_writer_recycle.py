"""A writer recycle (`shardq.runtime.writer._recycle`) in a running server.

A writer that committed a busy period and went quiet holds more than a fresh one; it stops and
the supervisor replaces it at once (not a crash). The shards resend what it had not
confirmed, so a trickle of durable pushes and a long-polling worker run across the recycle:
every push acknowledged is pulled exactly once, no request fails, jobs committed before it
still answer, and the new writer is a new, smaller process. With `writer_recycle_idle_ms` 0
the writer stays.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer, poll_until
from test_shard_recycle import _Traffic

from shardq.client import TcpConnection

RECYCLE_ENV = {
    "SHARDQ_WRITER_RECYCLE_IDLE_MS": "500",
    "SHARDQ_WRITER_RECYCLE_GROW_MB": "1",
    "SHARDQ_MEMORY_RELEASE_IDLE_MS": "300",
    # The shard stays: what recycles here is the writer alone.
    "SHARDQ_SHARD_RECYCLE_IDLE_MS": "0",
}
GROW_JOBS = 10_000


def _grow(conn: TcpConnection, queue: str, jobs: int) -> list[str]:
    """Push `jobs` padded jobs and drain them (the writer commits every one twice); the ids
    of the last batch pulled, completed."""
    pad = "x" * 400
    for b in range(jobs // 1000):
        batch = [{"name": "j", "data": {"i": b * 1000 + i, "pad": pad}} for i in range(1000)]
        assert conn.call({"cmd": "PUSHB", "queue": queue, "jobs": batch, "durable": True})["ok"]
    last: list[str] = []
    while True:
        pulled = conn.call({"cmd": "PULLB", "queue": queue, "count": 1000})["jobs"]
        if not pulled:
            return last
        last = [str(job["id"]) for job in pulled]
        assert conn.call({"cmd": "ACKB", "ids": last})["ok"]


def _recycled(server: ShardqServer) -> list[dict[str, Any]]:
    return [line for line in server.logs() if line.get("event") == "writer recycled"]


def _grown_server(
    shardq_server: Callable[..., ShardqServer], env: dict[str, str]
) -> tuple[ShardqServer, list[str]]:
    server = shardq_server(shards=1, env=env, http_port=0)
    conn = TcpConnection(*server.tcp_address)
    try:
        done = _grow(conn, "grow", GROW_JOBS)
    finally:
        conn.close()
    return server, done


def test_a_quiet_grown_writer_recycles_and_loses_nothing(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server, done = _grown_server(shardq_server, RECYCLE_ENV)
    old_pid = server.child_pids()["writer"]
    line = _Traffic(server, "trickle").across(lambda: _recycled(server), "a writer recycle")
    assert line["child"] == "writer"
    assert line["rss_mb_after"] < line["rss_mb_before"]
    # Replaced, not restarted after a crash: a new process, no restart counted.
    assert server.child_pids()["writer"] != old_pid
    events = {str(line.get("event")) for line in server.logs()}
    assert "writer recycling" in events
    assert not events & {"child exited unexpectedly", "child restarted"}
    # What the old writer committed, the new one still has.
    conn = TcpConnection(*server.tcp_address)
    try:
        for job_id in done[:20]:
            assert conn.call({"cmd": "GetState", "id": job_id}).get("state") == "completed"
        counts = conn.call({"cmd": "GetJobCounts", "queue": "grow"})
    finally:
        conn.close()
    assert counts["counts"]["waiting"] == 0, counts
    assert server.stop() == 0, server.log_tail()
    # A restart reads the same: the new writer's commits and the old one's are on disk.
    server.start()
    conn = TcpConnection(*server.tcp_address)
    try:
        assert conn.call({"cmd": "GetState", "id": done[0]}).get("state") == "completed"
        assert conn.call({"cmd": "Count", "queue": "trickle"})["count"] == 0
    finally:
        conn.close()
    assert server.stop() == 0, server.log_tail()


def test_a_vacuum_pass_only_wanted_does_not_hold_the_recycle_off(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    # Every commit makes a pass wanted for the writer's next idle moment. With that moment
    # longer than the trickle's gaps (a commit every 250 ms), a pass is wanted at every
    # check and never starts: the recycle must not wait for it (the new writer starts with
    # one wanted). It once did, and a steady trickle could hold the writer off for good.
    env = {**RECYCLE_ENV, "SHARDQ_VACUUM_IDLE_MS": "5000"}
    server, _done = _grown_server(shardq_server, env)
    line = _Traffic(server, "trickle").across(lambda: _recycled(server), "a writer recycle")
    assert line["child"] == "writer"
    assert server.find_log("vacuum started") is None  # no pass ran, none held it off
    declined = [e for e in server.logs() if e.get("event") == "writer not recycling"]
    assert all(e["reason"] != "vacuum pass wanted" for e in declined), declined
    assert server.stop() == 0, server.log_tail()


def test_writer_recycle_off_keeps_the_writer(shardq_server: Callable[..., ShardqServer]) -> None:
    env = {**RECYCLE_ENV, "SHARDQ_WRITER_RECYCLE_IDLE_MS": "0"}
    server, _done = _grown_server(shardq_server, env)
    pid = server.child_pids()["writer"]
    poll_until(
        lambda: server.find_log("memory given back", role="writer"), 30, "the writer's give-back"
    )
    time.sleep(1.5)  # three recycle periods of the other test
    assert _recycled(server) == []
    assert server.child_pids()["writer"] == pid
    assert server.stop() == 0, server.log_tail()
