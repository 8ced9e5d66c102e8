"""An idle server sleeps: `shardq start --shards 2` with no traffic uses under 2 % of one core
(issue 3: shards sleep until their next timer). With `spin_us` they busy-poll only that long
after their last message, so an idle server sleeps all the same."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from shardq_harness import ShardqServer

from shardq.client import TcpConnection

WINDOW_S = 10.0
BUDGET = 0.02  # of one core, over the window
SETTLE_S = 1.0
READY_EVENTS = ("front end ready", "shard recovered")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (fields 14 and 15 of /proc/<pid>/stat), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces; fields[0] is field 3
    ticks = int(fields[14 - 3]) + int(fields[15 - 3])
    return ticks / os.sysconf("SC_CLK_TCK")


def call(server: ShardqServer, command: dict[str, object]) -> None:
    host, port = server.tcp_address
    conn = TcpConnection(host, port)
    try:
        assert conn.call(command)["ok"]
    finally:
        conn.close()


@pytest.mark.parametrize("spin_us", [0, 500, "auto"])
def test_idle_server_uses_under_2_percent_cpu(
    shardq_server: Callable[..., ShardqServer], spin_us: int | str
) -> None:
    """Also with `spin_us`: spinning ends `spin_us` after the last message, then they sleep."""
    server = shardq_server(shards=2, env={"SHARDQ_SPIN_US": str(spin_us)})
    for _ in range(50):  # traffic first, so that every process has something to spin after
        call(server, {"cmd": "PUSH", "queue": "idle", "data": {}})
        call(server, {"cmd": "Count", "queue": "idle"})
    time.sleep(SETTLE_S)  # start-up work (imports, recovery) is not idling
    pids = {"supervisor": server.pid, **server.child_pids()}
    assert set(pids) == {"supervisor", "writer", "shard-0", "shard-1", "frontend"}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(WINDOW_S)  # the measurement itself: nothing happens, on purpose
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    elapsed = time.monotonic() - started
    assert server.child_pids() == {k: v for k, v in pids.items() if k != "supervisor"}

    # the setting reached every process that spins
    spins = [line.get("spin_us") for line in server.logs() if line.get("event") in READY_EVENTS]
    assert spins == [spin_us] * 3, spins
    used = {name: after[name] - before[name] for name in pids}
    total = sum(used.values())
    report = ", ".join(f"{name} (pid {pids[name]}): {used[name]:.3f} s" for name in pids)
    assert total < BUDGET * elapsed, (
        f"idle for {elapsed:.1f} s, used {total:.3f} s of CPU ({100 * total / elapsed:.2f} % "
        f"of one core, budget {100 * BUDGET:g} %): {report}"
    )
    assert server.stop() == 0, server.log_tail()
