"""After a drain a shard settles near what a fresh process holding its jobs takes
(`shardq.runtime.shard._recycle`, the default `shard_recycle_grow_mb`).

A shard that keeps a completed window of 20,000 jobs and drained 60,000 stays at 76-83 MB
after its idle give-back, where a fresh process holding the same window takes 49-50 MB (35 to
36 MB empty, measured on the 2-core VM). The limit it used to recycle at, its fresh size plus
64 MB plus twice its jobs' estimate (about 17 MB here), was about 134 MB: it never recycled.
With the defaults now (16 MB above what a fresh process holding its jobs takes: its size,
plus the completed window's estimate, plus the other jobs' times the factor its start
measured) it recycles and the new process holds about 50 MB.
"""

from __future__ import annotations

from collections.abc import Callable

from shardq_harness import ShardqServer, poll_until
from test_shard_recycle import _recycled, _rss_mb

from shardq.client import TcpConnection

# The recycle's grow margin left at its default: only the idle times are shortened.
ENV = {
    "SHARDQ_SHARD_MEMORY_MB": "16",
    "SHARDQ_SHARD_RECYCLE_IDLE_MS": "500",
    "SHARDQ_ENGINE_MAX_COMPLETED": "20000",
    "SHARDQ_MEMORY_RELEASE_IDLE_MS": "300",
}
JOBS = 60_000
# A fresh shard holding the 20,000 completed jobs (49-50 MB measured), with room for noise;
# the drained shard stays above 75 MB without a recycle.
SETTLED_SHARD_MB = 62


def _push_and_drain(conn: TcpConnection, queue: str) -> None:
    for b in range(JOBS // 1000):
        batch = [{"name": "j", "data": {"i": b * 1000 + i}} for i in range(1000)]
        assert conn.call({"cmd": "PUSHB", "queue": queue, "jobs": batch})["ok"]
    drained = 0
    while drained < JOBS:
        pulled = conn.call({"cmd": "PULLB", "queue": queue, "count": 1000})["jobs"]
        assert pulled, f"the queue ran dry after {drained} of {JOBS}"
        assert conn.call({"cmd": "ACKB", "ids": [job["id"] for job in pulled]})["ok"]
        drained += len(pulled)


def test_a_drained_shard_settles_near_a_fresh_ones_size_at_the_default_margin(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=1, env=ENV, http_port=0)
    old_pid = server.child_pids()["shard-0"]
    conn = TcpConnection(*server.tcp_address, timeout=60)
    try:
        _push_and_drain(conn, "settle")
        line = poll_until(lambda: _recycled(server), 60, "a shard recycle",
                          detail=server.log_tail)[0]  # fmt: skip
        pid = server.child_pids()["shard-0"]
        assert pid != old_pid
        assert line["rss_mb_after"] < SETTLED_SHARD_MB < line["rss_mb_before"], line
        assert _rss_mb(pid) < SETTLED_SHARD_MB
        # Every lookup still answers: the newest completed job, the counts.
        counts = conn.call({"cmd": "GetJobCounts", "queue": "settle"})
        assert counts["ok"] and counts["counts"]["completed"] == 20_000, counts
        assert counts["counts"]["waiting"] == 0, counts
    finally:
        conn.close()
    assert server.stop() == 0, server.log_tail()
