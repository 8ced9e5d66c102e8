"""The completed jobs a shard reloads cost what they hold, not the memory their load went
through (`Timers._load` packs each completed job as it loads it, `shardq.core._packed`).

After a drain a quiet, grown shard recycles (`shard/_recycle.py`): a fresh process takes
over and reloads the newest `max_completed` completed jobs. Packed only at the end of the
load, the jobs' payloads, results and timelines had filled the allocator's arenas first and
the packed survivors kept them all: 10,000 such jobs left the new shard about 9 MB above
what they hold. Here the new shard's RSS must stay within `WINDOW_MB` of an empty shard's,
and the completed jobs still answer GetJob and GetResult as they did before the recycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer, completed_answers, poll_until, rss_bytes

from shardq.client import TcpConnection

KEEP = 10_000
ENV = {
    "SHARDQ_SHARD_MEMORY_MB": "4",
    "SHARDQ_SHARD_RECYCLE_IDLE_MS": "500",
    "SHARDQ_SHARD_RECYCLE_GROW_MB": "1",
    "SHARDQ_ENGINE_MAX_COMPLETED": str(KEEP),
    "SHARDQ_ENGINE_MAX_RESULTS": str(KEEP // 4),
    "SHARDQ_MEMORY_RELEASE_IDLE_MS": "300",
}
# An empty shard is 35 to 36 MB on the 2-core VM. The new shard, with its 10,000 completed
# jobs loaded, measured 46.5 MB; packed only at the end of the load, 55.4 MB.
EMPTY_MB = 36
WINDOW_MB = 15
JOBS = 40_000
PAD = "p" * 120


def _push_and_drain(conn: TcpConnection, queue: str) -> list[str]:
    """Push `JOBS` jobs and complete them all with a result; the completed ids, in order."""
    done: list[str] = []
    for b in range(JOBS // 1000):
        batch = [{"name": "j", "data": {"i": b * 1000 + i, "pad": PAD}} for i in range(1000)]
        assert conn.call({"cmd": "PUSHB", "queue": queue, "jobs": batch})["ok"]
    while True:
        pulled = conn.call({"cmd": "PULLB", "queue": queue, "count": 1000})["jobs"]
        if not pulled:
            return done
        ids = [str(job["id"]) for job in pulled]
        results = [{"sum": job["data"]["i"] * 2, "tag": PAD[:40]} for job in pulled]
        assert conn.call({"cmd": "ACKB", "ids": ids, "results": results})["ok"]
        done += ids


def _recycled(server: ShardqServer) -> list[dict[str, Any]]:
    return [line for line in server.logs() if line.get("event") == "shard recycled"]


def test_a_recycled_shard_holds_its_completed_window_at_its_size(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=1, env=ENV, http_port=0)
    old_pid = server.child_pids()["shard-0"]
    conn = TcpConnection(*server.tcp_address, timeout=30)
    try:
        done = _push_and_drain(conn, "window")
        sample = [done[-KEEP], done[-KEEP // 2], done[-1]]
        before = completed_answers(conn, sample)
        # The newest results are kept (`max_results`), the older ones are not.
        newest = before[-2]["data"]["i"]
        assert before[-1] == {"sum": 2 * newest, "tag": PAD[:40]}, before
        assert before[1] is None, before
        poll_until(lambda: _recycled(server), 60, "a shard recycle", detail=server.log_tail)
        new_pid = server.child_pids()["shard-0"]
        assert new_pid != old_pid
        # The new process gives back what its load left once it has loaded (`recovered`).
        poll_until(
            lambda: any(
                line.get("event") == "memory given back" and line.get("pid") == new_pid
                for line in server.logs()
            ),
            30,
            "the new shard's release after its load",
        )
        rss = rss_bytes(new_pid) / 2**20
        assert rss < EMPTY_MB + WINDOW_MB, (rss, _recycled(server))
        assert completed_answers(conn, sample) == before
        counts = conn.call({"cmd": "GetJobCounts", "queue": "window"})
        assert counts["counts"]["completed"] == KEEP, counts
    finally:
        conn.close()
    assert server.stop() == 0, server.log_tail()
