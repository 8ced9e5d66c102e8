"""The memory budget in a running server (`shard_memory_mb`, docs/runtime.md "The memory
budget"): a shard given 8 MiB keeps its estimate of its resident jobs under it by sending the
backlog's tail cold, its RSS levels off while a backlog of about 170 MB of jobs is pushed,
and a drain returns every job once, in push order. /prometheus shows the budget, the
estimate and the cold jobs; a small backlog leaves nothing cold.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from shardq_harness import ShardqServer

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
BUDGET_MB = 8
TOTAL = 100_000
BATCH = 1_000
PAD = "x" * 400  # about 1.7 KB a job in memory: ~170 MB for the backlog without a budget
WAIT_S = 60.0
QUEUE = "mb-q"


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096


def _scrape(conn: TcpConnection) -> dict[str, float]:
    text = conn.call({"cmd": "Prometheus"})["data"]["metrics"]
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_a_shard_keeps_its_jobs_under_8_mib_and_drains_in_order(
    shardq_server: Factory, tmp_path: Path
) -> None:
    server = shardq_server(
        shards=1, data_dir=tmp_path / "mb", env={"SHARDQ_SHARD_MEMORY_MB": str(BUDGET_MB)}
    )
    shard = server.child_pids()["shard-0"]
    start_rss = _rss(shard)
    peak = start_rss
    cold_seen: list[int] = []
    peaks: list[int] = []
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        small = _scrape(conn)
        assert small['shardq_shard_memory_budget_bytes{shard="0"}'] == BUDGET_MB << 20
        for start in range(0, TOTAL, BATCH):
            # Completed jobs kept in memory (`max_completed`) cannot go cold: these leave.
            jobs = [
                {"data": {"i": i, "pad": PAD}, "removeOnComplete": True}
                for i in range(start, start + BATCH)
            ]
            conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})
            peak = max(peak, _rss(shard))
            if start % (10 * BATCH) == 0:
                cold_seen.append(int(conn.call({"cmd": "Stats"})["stats"]["coldJobs"]))
                peaks.append(peak)
        metrics = _scrape(conn)
        cold = metrics['shardq_shard_cold_jobs{shard="0"}']
        resident = metrics['shardq_shard_resident_jobs{shard="0"}']
        estimate = metrics['shardq_shard_resident_bytes{shard="0"}']
        print(f"rss start {start_rss >> 20} MiB, peak {peak >> 20} MiB; cold {cold:.0f}, "
              f"resident {resident:.0f} jobs, estimate {int(estimate) >> 20} MiB",
              [p >> 20 for p in peaks])  # fmt: skip
        # The cold backlog grew as the pushes went on, and holds all but the head.
        assert cold_seen == sorted(cold_seen) and cold_seen[-1] > 0, cold_seen
        assert cold >= TOTAL - resident and resident < TOTAL // 4, (cold, resident)
        assert estimate <= BUDGET_MB << 20, estimate
        assert metrics['shardq_shard_memory_over{shard="0"}'] == 0
        # Bounded: the second half of the pushes adds little (without a budget, about 1.7
        # KB a job: some 85 MB); what the first half added is the writer's lag (records kept
        # until their commit) and the heap's high-water mark, not jobs. The writer's lag
        # grows on a loaded machine (34 MB past the half under the parallel suite), so the
        # bound is half of what the jobs alone would add.
        half = peaks[len(peaks) // 2]
        assert peaks[-1] - half < 48 << 20, [p >> 20 for p in peaks]
        counts = conn.call({"cmd": "GetJobCounts", "queue": QUEUE})["counts"]
        assert counts["waiting"] == TOTAL, counts
        order: list[int] = []
        while jobs := conn.call({"cmd": "PULLB", "queue": QUEUE, "count": 500})["jobs"]:
            order += [j["data"]["i"] for j in jobs]
            conn.call({"cmd": "ACKB", "ids": [j["id"] for j in jobs]})
            peak = max(peak, _rss(shard))
        assert order == list(range(TOTAL))
        assert peak - half < 48 << 20, (half, peak)  # the drain pages in, a head at a time
    assert server.find_log("memory budget passed by jobs that stay in memory") is None
    failed = [line for line in server.logs() if line.get("level") in ("error", "critical")]
    assert not failed, failed[:3]
    assert server.stop() == 0, server.log_tail()


def test_a_small_backlog_stays_in_memory(shardq_server: Factory, tmp_path: Path) -> None:
    """Under a budget of 256 MiB 5,000 jobs fit: nothing goes cold, no head."""
    env = {"SHARDQ_SHARD_MEMORY_MB": "256"}
    server = shardq_server(shards=1, data_dir=tmp_path / "small", env=env)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        for start in range(0, 5_000, BATCH):
            jobs = [{"data": {"i": i}} for i in range(start, start + BATCH)]
            conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})
        metrics = _scrape(conn)
        stats = conn.call({"cmd": "Stats"})["stats"]
    assert metrics['shardq_shard_memory_budget_bytes{shard="0"}'] == 256 << 20
    assert metrics['shardq_shard_cold_jobs{shard="0"}'] == 0
    assert 0 < metrics['shardq_shard_resident_bytes{shard="0"}'] < 16 << 20
    assert stats["residentJobs"] == 5_000 and stats["coldJobs"] == 0
    assert server.stop() == 0, server.log_tail()


def test_a_restart_of_a_shard_past_its_budget_reads_its_heads_back(
    shardq_server: Factory, tmp_path: Path
) -> None:
    """Stopped with most of its backlog cold, a shard under a memory budget installs its
    head before it restores the jobs, keeps the cold ones in storage, and drains in order."""
    data, total = tmp_path / "restart", 30_000
    env = {"SHARDQ_SHARD_MEMORY_MB": str(BUDGET_MB)}
    server = shardq_server(shards=1, data_dir=data, env=env)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        for start in range(0, total, BATCH):
            jobs = [
                {"data": {"i": i, "pad": PAD}, "removeOnComplete": True}
                for i in range(start, start + BATCH)
            ]
            conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})
        cold = int(conn.call({"cmd": "Stats"})["stats"]["coldJobs"])
    assert cold > total // 2, cold
    assert server.stop() == 0, server.log_tail()
    server = shardq_server(shards=1, data_dir=data, env=env)
    restored = server.find_log("cold backlog restored")
    assert restored is not None and restored["cold_jobs"] >= cold, restored
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        assert conn.call({"cmd": "GetJobCounts", "queue": QUEUE})["counts"]["waiting"] == total
        assert int(conn.call({"cmd": "Stats"})["stats"]["residentJobs"]) < total // 2
        order: list[int] = []
        while jobs := conn.call({"cmd": "PULLB", "queue": QUEUE, "count": 500})["jobs"]:
            order += [j["data"]["i"] for j in jobs]
            conn.call({"cmd": "ACKB", "ids": [j["id"] for j in jobs]})
    assert order == list(range(total))
    assert server.stop() == 0, server.log_tail()
