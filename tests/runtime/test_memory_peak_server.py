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

A shard over its budget packs the jobs it completes as it goes (`shard/_memory.py`
`BudgetCheck`), not only at its next idle release: the completed window (`max_completed`) is
what a drain adds, and the heads cannot shrink below their floor to make room for it (on
1,000,000 jobs under 128 MB, 50,000 completed jobs unpacked held the shard some 50 MB above
its budget through the drain). Packed jobs answer GetJob and GetResult as before.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from shardq_harness import ShardqServer, completed_answers

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


def test_a_shard_over_its_budget_packs_the_jobs_it_completes(shardq_server: Factory) -> None:
    # No idle release and no recycle: what packs the completed jobs is the budget.
    env = {
        "SHARDQ_SHARD_MEMORY_MB": "4",
        "SHARDQ_MEMORY_RELEASE_IDLE_MS": "0",
        "SHARDQ_SHARD_RECYCLE_IDLE_MS": "0",
        "SHARDQ_ENGINE_MAX_COMPLETED": "20000",
    }
    total, pad = 20_000, "p" * 100
    server = shardq_server(shards=1, env=env)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        for start in range(0, total, BATCH):
            jobs = [{"data": {"i": i, "pad": pad}} for i in range(start, start + BATCH)]
            conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})
        done: list[str] = []
        for _ in range(total // BATCH + 2):
            pulled = conn.call({"cmd": "PULLB", "queue": QUEUE, "count": BATCH})["jobs"]
            if not pulled:
                break
            ids = [str(j["id"]) for j in pulled]
            results = [{"sum": 2 * j["data"]["i"]} for j in pulled]
            assert conn.call({"cmd": "ACKB", "ids": ids, "results": results})["ok"]
            done += ids
        assert len(done) == total
        packed = [line for line in server.logs()
                  if line.get("event") == "memory budget packed completed jobs"]  # fmt: skip
        assert packed, server.log_tail()
        # Packed while the drain went on: a pass per turn that completed jobs (about one
        # per ACKB), logged at the 1st, 2nd, 4th ... pass, so the last line logged counts
        # at least some half of them.
        assert max(line["packed"] for line in packed) >= total // 4, packed[-1]
        sample = [done[0], done[total // 2], done[-1]]
        answers = completed_answers(conn, sample)
        for k, job_id in enumerate(sample):
            job, result = answers[2 * k], answers[2 * k + 1]
            assert job["id"] == job_id and job["data"]["pad"] == pad, job
            assert result in (None, {"sum": 2 * job["data"]["i"]}), (job, result)
        assert answers[-1] == {"sum": 2 * answers[-2]["data"]["i"]}, answers[-2:]
        counts = conn.call({"cmd": "GetJobCounts", "queue": QUEUE})["counts"]
        assert counts["completed"] == total, counts
    assert server.stop() == 0, server.log_tail()
