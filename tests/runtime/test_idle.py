"""An idle server sleeps: `shardq start --shards 2` with no traffic uses under 2 % of one core
(issue 3: shards never busy-poll; they sleep until their next timer)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from shardq_harness import ShardqServer

WINDOW_S = 10.0
BUDGET = 0.02  # of one core, over the window
SETTLE_S = 1.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (fields 14 and 15 of /proc/<pid>/stat), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces; fields[0] is field 3
    ticks = int(fields[14 - 3]) + int(fields[15 - 3])
    return ticks / os.sysconf("SC_CLK_TCK")


def test_idle_server_uses_under_2_percent_cpu(shardq_server: Callable[..., ShardqServer]) -> None:
    server = shardq_server(shards=2)
    time.sleep(SETTLE_S)  # start-up work (imports, recovery) is not idling
    pids = {"supervisor": server.pid, **server.child_pids()}
    assert set(pids) == {"supervisor", "writer", "shard-0", "shard-1", "frontend"}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(WINDOW_S)  # the measurement itself: nothing happens, on purpose
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    elapsed = time.monotonic() - started
    assert server.child_pids() == {k: v for k, v in pids.items() if k != "supervisor"}

    used = {name: after[name] - before[name] for name in pids}
    total = sum(used.values())
    report = ", ".join(f"{name} (pid {pids[name]}): {used[name]:.3f} s" for name in pids)
    assert total < BUDGET * elapsed, (
        f"idle for {elapsed:.1f} s, used {total:.3f} s of CPU ({100 * total / elapsed:.2f} % "
        f"of one core, budget {100 * BUDGET:g} %): {report}"
    )
    assert server.stop() == 0, server.log_tail()
