"""The memory budget holds the shard's process, not only its estimate (`shard_memory_mb`,
docs/runtime.md "The memory budget", `shardq.core._budget` "The process"): a shard given
16 MiB, pushed a backlog of small jobs that would take some 45 MB in memory, never holds
more than its budget and its work in flight above its idle RSS, neither while pushed, nor
while it restarts on it (it restores the heads it had and pages only up to them), nor while
it drains; the drain returns the jobs in order. A restart sizes its heads on the jobs it
restored (the build before this sat them at `head_min_jobs` and sent 14,000 restored jobs
straight back cold).

The peak is the kernel's (`VmHWM`, /proc/<pid>/status), read before each stop: a short
peak between two samples counts too. Small jobs (`{"i": n}`) are the hard case: beside a
resident job, what a shard holds while the writer commits its cold pushes (a record each)
weighs most.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from shardq_harness import ShardqServer

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
BUDGET_MB = 16
TOTAL = 50_000
BATCH = 1_000
DRAIN = 15_000
QUEUE = "rss-q"
WAIT_S = 120.0
# Beside the budget, a shard holds its work in flight: requests read and not yet served,
# batches and records kept until the writer's commit, and the heap's free blocks. Measured:
# 40 to 60 MiB, whatever the budget (docs/runtime.md); this leaves a little room over it.
WORK_MB = 64
BOUND = (BUDGET_MB + WORK_MB) << 20


def status(pid: int, field: str) -> int:
    """A /proc/<pid>/status field in bytes (`VmRSS`, `VmHWM`; test_memory_trim_server too)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    raise AssertionError(f"no {field} for {pid}")


def _drain(conn: TcpConnection, limit: int) -> list[int]:
    order: list[int] = []
    while len(order) < limit:
        reply = conn.call({"cmd": "PULLB", "queue": QUEUE, "count": 500})
        if not reply["jobs"]:
            break
        order += [j["data"]["i"] for j in reply["jobs"]]
        conn.call({"cmd": "ACKB", "ids": [j["id"] for j in reply["jobs"]]})
    return order


def test_a_shard_holds_its_process_near_its_budget_through_push_restart_and_drain(
    shardq_server: Factory, tmp_path: Path
) -> None:
    data, env = tmp_path / "rss", {"SHARDQ_SHARD_MEMORY_MB": str(BUDGET_MB)}
    server = shardq_server(shards=1, data_dir=data, env=env)
    shard = server.child_pids()["shard-0"]
    idle = status(shard, "VmRSS")
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        for start in range(0, TOTAL, BATCH):
            jobs = [{"data": {"i": i}} for i in range(start, start + BATCH)]
            conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})
        stats = conn.call({"cmd": "Stats"})["stats"]
        pushed = status(shard, "VmHWM")
    assert int(stats["coldJobs"]) > TOTAL // 2, stats
    # Visible: the shard says when the process, not the estimate, cut its heads.
    cut = server.find_log("memory budget cut the heads to fit the process")
    assert cut is not None and cut["process_mb"] >= BUDGET_MB, server.log_tail()
    assert server.stop() == 0, server.log_tail()

    server = shardq_server(shards=1, data_dir=data, env=env)
    shard = server.child_pids()["shard-0"]
    restarted = status(shard, "VmHWM")
    restored = server.find_log("cold backlog restored")
    assert restored is not None, server.log_tail()
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        order = _drain(conn, DRAIN)
        drained = status(shard, "VmHWM")
        waiting = conn.call({"cmd": "GetJobCounts", "queue": QUEUE})["counts"]["waiting"]
    peaks = {"push": pushed, "restart": restarted, "drain": drained}
    print(f"idle {idle >> 20} MiB; peaks above it (MiB):",
          {k: (v - idle) >> 20 for k, v in peaks.items()}, "restored:", restored)  # fmt: skip
    for moment, peak in peaks.items():
        assert peak - idle <= BOUND, (moment, (peak - idle) >> 20, BOUND >> 20)
    # The restart sized its heads on what it restored: none sits at its floor, and no more
    # than a head's worth of restored jobs went back cold (a write and a kept record each).
    assert restored["head_jobs"] > 1_000, restored
    assert restored["mutations"] <= restored["head_jobs"], restored
    assert order == list(range(DRAIN)) and waiting == TOTAL - DRAIN, (len(order), waiting)
    assert server.stop() == 0, server.log_tail()
