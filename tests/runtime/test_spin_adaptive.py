"""`spin_us = "auto"` on a real server: requests in a quick rhythm (where it spins) are all
answered, durable ones too, and once they stop the server goes quiet: its processes together
use almost no CPU time over the next seconds (docs/runtime.md, "Spinning")."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from shardq_harness import ShardqServer

from shardq.client import TcpConnection

IDLE_S = 2.0
# Of one core, over the idle window: a process that kept spinning would use 100 %.
BUDGET = 0.05
SETTLE_S = 0.5
READY_EVENTS = ("front end ready", "shard recovered")
REQUESTS = 300


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (fields 14 and 15 of /proc/<pid>/stat), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[14 - 3]) + int(fields[15 - 3])) / os.sysconf("SC_CLK_TCK")


def test_auto_spin_answers_requests_then_an_idle_server_sleeps(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=2, env={"SHARDQ_SPIN_US": "auto"})
    host, port = server.tcp_address
    conn = TcpConnection(host, port)
    try:
        # One request in flight at a time, back to back: the rhythm adaptive spinning follows.
        for n in range(REQUESTS):
            reply = conn.call({"cmd": "PUSH", "queue": "auto", "data": {"n": n}})
            assert reply["ok"] and reply["id"], reply
        for n in range(REQUESTS // 10):
            reply = conn.call(
                {"cmd": "PUSH", "queue": "auto", "data": {"n": n}, "durable": True}
            )
            assert reply["ok"] and reply["id"], reply
        count = conn.call({"cmd": "Count", "queue": "auto"})
        assert count["ok"] and count["count"] == REQUESTS + REQUESTS // 10, count
    finally:
        conn.close()

    time.sleep(SETTLE_S)
    pids = {"supervisor": server.pid, **server.child_pids()}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(IDLE_S)  # the measurement: no client at all
    used = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    elapsed = time.monotonic() - started
    assert server.child_pids() == {k: v for k, v in pids.items() if k != "supervisor"}

    spins = [line.get("spin_us") for line in server.logs() if line.get("event") in READY_EVENTS]
    assert spins == ["auto"] * 3, spins  # the front end and both shards run the policy
    total = sum(used.values())
    report = ", ".join(f"{name}: {seconds:.3f} s" for name, seconds in used.items())
    assert total < BUDGET * elapsed, f"idle {elapsed:.1f} s, used {total:.3f} s: {report}"
    assert server.stop() == 0, server.log_tail()
