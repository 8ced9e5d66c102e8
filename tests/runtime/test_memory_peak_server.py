"""What bounds a shard's peak under its memory budget (`shard_memory_mb`, docs/runtime.md
"The memory budget"), counted, not timed.

A restart reads back no more than the heads the shard held when it
stopped (`shard_memory_mb`, docs/runtime.md "The memory budget", "At start"): the restored
process is smaller than the one that stopped (no writer lag, no heap left over from the push),
so its budget seemed to have room, and the build before this paged every head up to that
room at once and cut it back after its first look: on 1,000,000 jobs under 128 MB, 72,000
jobs restored, 30,000 more paged in and 42,000 sent back cold, the shard's peak of the run.
The heads grow after the start a page at a time, while the process has room, as in a drain.

The jobs held (`residentJobs` of Stats) before the stop and after the start, and the head
size the start logged, say so. A drain after it returns every job in order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from shardq_harness import ShardqServer

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
BUDGET_MB = 32
TOTAL = 80_000
BATCH = 1_000
QUEUE = "restart-q"
WAIT_S = 120.0


def _stats(conn: TcpConnection) -> dict[str, int]:
    stats = conn.call({"cmd": "Stats"})["stats"]
    return {k: int(stats[k]) for k in ("residentJobs", "coldJobs")}


def test_a_restart_reads_back_no_more_than_the_heads_it_held(
    shardq_server: Factory, tmp_path: Path
) -> None:
    data, env = tmp_path / "restart", {"SHARDQ_SHARD_MEMORY_MB": str(BUDGET_MB)}
    server = shardq_server(shards=1, data_dir=data, env=env)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        for start in range(0, TOTAL, BATCH):
            jobs = [
                {"data": {"i": i}, "removeOnComplete": True} for i in range(start, start + BATCH)
            ]
            conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})
        before = _stats(conn)
    held = before["residentJobs"]
    assert before["coldJobs"] >= TOTAL - held and held > 1_000, before
    assert server.stop() == 0, server.log_tail()

    server = shardq_server(shards=1, data_dir=data, env=env)
    restored = server.find_log("cold backlog restored")
    assert restored is not None, server.log_tail()
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        after = _stats(conn)
        print("before the stop:", before, "after the start:", after, "restored:", restored)
        # The head it restored is the one it held, and one job more: the read that finds
        # where the cold backlog starts. Nothing it read went straight back cold.
        assert restored["head_jobs"] <= held + 1, (restored, before)
        assert restored["mutations"] == 0, restored
        assert after["residentJobs"] <= held + 1, (after, before)
        assert after["residentJobs"] + after["coldJobs"] == TOTAL, after
        order: list[int] = []
        for _ in range(TOTAL // 500 + 2):
            reply = conn.call({"cmd": "PULLB", "queue": QUEUE, "count": 500})
            if not reply["jobs"]:
                break
            order += [j["data"]["i"] for j in reply["jobs"]]
            conn.call({"cmd": "ACKB", "ids": [j["id"] for j in reply["jobs"]]})
    assert order == list(range(TOTAL))
    assert server.stop() == 0, server.log_tail()

