"""A shard that reloads its completed jobs at a restart holds each in a few hundred bytes.

After a restart (or a recycle, `shard/_recycle.py`) a shard reloads the newest
`max_completed` completed jobs and keeps them so that GetJob, GetResult and GetJobs answer
for them. Each is a `PackedJob` (`shardq.core._packed`: the slots object, its bulky fields
and three of its times in one msgpack record) in completion order (`shardq.core._order`).

Here two shards restart, one holding `N` completed jobs, the other none, and the first may
be at most `PER_JOB_BYTES` a job above the second. What a reloaded completed `{"i": n}`
job holds (bench/results/2026-12-05-s10-done-window.md, tracemalloc at 50,000): its object
320 bytes, its id 85, its seq 28, its packed record 82, its entries in the jobs table and
its queue's ids about 70, in the completion order 8, its two times shared with other jobs:
about 600 bytes, and the allocator's partly filled arenas on top. Measured here: 766 bytes
a job on this branch, 939 on the build before it (the times unpacked and unshared, the
order an OrderedDict); an unpacked job costs about 1.9 KB. The jobs answer as they did
before the restart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer, completed_answers, rss_bytes

from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of

N = 20_000
PER_JOB_BYTES = 850
ENV = {
    "SHARDQ_ENGINE_MAX_COMPLETED": str(N),
    "SHARDQ_ENGINE_MAX_RESULTS": str(N // 10),
}


def _queue_on(shard: int) -> str:
    return next(f"done-{i}" for i in range(1000) if shard_of(f"done-{i}", 2) == shard)


def _push_and_drain(conn: TcpConnection, queue: str) -> list[str]:
    """Push `N` jobs, complete them all with a result; the completed ids, in order."""
    done: list[str] = []
    for b in range(N // 1000):
        batch = [{"data": {"i": b * 1000 + i}} for i in range(1000)]
        assert conn.call({"cmd": "PUSHB", "queue": queue, "jobs": batch})["ok"]
    for _ in range(N):
        pulled = conn.call({"cmd": "PULLB", "queue": queue, "count": 1000})["jobs"]
        if not pulled:
            break
        ids = [str(job["id"]) for job in pulled]
        results = [{"sum": job["data"]["i"] * 2} for job in pulled]
        assert conn.call({"cmd": "ACKB", "ids": ids, "results": results})["ok"]
        done += ids
    return done


def _answers(conn: TcpConnection, queue: str, ids: list[str]) -> list[Any]:
    out = completed_answers(conn, ids, states=True)
    for offset in (0, N - 50):
        page = {"cmd": "GetJobs", "queue": queue, "state": "completed", "offset": offset,
                "limit": 50, "asc": True}  # fmt: skip
        jobs = conn.call(page)["jobs"]
        assert len(jobs) == 50, jobs
        out.append(jobs)
    out.append(conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"])
    return out


def test_reloaded_completed_jobs_cost_a_few_hundred_bytes_each(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=2, env=ENV, start=False)
    server.start(timeout=120)
    queue = _queue_on(0)
    conn = TcpConnection(*server.tcp_address, timeout=30)
    try:
        done = _push_and_drain(conn, queue)
        assert len(done) == N
        sample = [done[0], done[N // 2], done[-2], done[-1]]
        before = _answers(conn, queue, sample)
        assert before[1] is None and before[-5] == {"sum": 2 * before[-6]["data"]["i"]}, before
        assert before[-1]["completed"] == N, before[-1]
    finally:
        conn.close()
    assert server.stop() == 0, server.log_tail()
    server.start(timeout=120)
    # A shard reports ready before it hands its recovery's heap back: measure after that.
    for role in ("shard-0", "shard-1"):
        server.wait_for_log("memory given back", timeout=60, role=role, reason="recovered")
    pids = server.child_pids()
    held, empty = rss_bytes(pids["shard-0"]), rss_bytes(pids["shard-1"])
    per_job = (held - empty) / N
    assert per_job < PER_JOB_BYTES, (held, empty, per_job)
    conn = TcpConnection(*server.tcp_address, timeout=30)
    try:
        assert _answers(conn, queue, sample) == before
    finally:
        conn.close()
    assert server.stop() == 0, server.log_tail()
