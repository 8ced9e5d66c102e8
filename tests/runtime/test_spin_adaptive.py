"""`spin_us = "auto"` on a real server: requests in a quick rhythm are all answered, durable
ones too, and the front end stays awake between them (it spins instead of sleeping); once they
stop the server goes quiet: its processes together use almost no CPU time over the next
seconds (docs/runtime.md, "Spinning"). And with no idle CPU on the machine it does not spin at
all: it sleeps after each request as with spinning off."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardq_harness import ShardqServer

from shardq.client import TcpConnection

IDLE_S = 2.0
# Of one core, over the idle window: a process that kept spinning would use 100 %.
BUDGET = 0.05
SETTLE_S = 0.5
READY_EVENTS = ("front end ready", "shard recovered")
REQUESTS = 300
# Sleeps of the front end per Ping in a quick rhythm. Without spinning it sleeps once per
# request (about 0.9 measured); spinning, almost never (0.02 on a quiet machine, 0.15 with
# the two cores loaded 3x over).
MAX_SLEEPS_PER_PING = 0.5
# Any number of runnable tasks, no spin cut short: the rhythm test holds on a loaded machine.
NO_LOAD_LIMIT = {"SHARDQ_SPIN_AUTO_MAX_RUNNABLE": "4096", "SHARDQ_SPIN_AUTO_CUT_US": "0"}
HOG_S = 20.0  # the most a CPU hog of the crowded test lives, whatever happens to the test


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (fields 14 and 15 of /proc/<pid>/stat), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[14 - 3]) + int(fields[15 - 3])) / os.sysconf("SC_CLK_TCK")


def sleeps(pid: int) -> int:
    """Voluntary context switches of every thread of `pid`: how often it went to sleep."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def test_auto_spin_answers_requests_then_an_idle_server_sleeps(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=2, env={"SHARDQ_SPIN_US": "auto", **NO_LOAD_LIMIT})
    host, port = server.tcp_address
    conn = TcpConnection(host, port)
    try:
        # One request in flight at a time, back to back: the rhythm adaptive spinning follows.
        for n in range(REQUESTS):
            reply = conn.call({"cmd": "PUSH", "queue": "auto", "data": {"n": n}})
            assert reply["ok"] and reply["id"], reply
        for n in range(REQUESTS // 10):
            reply = conn.call({"cmd": "PUSH", "queue": "auto", "data": {"n": n}, "durable": True})
            assert reply["ok"] and reply["id"], reply
        count = conn.call({"cmd": "Count", "queue": "auto"})
        assert count["ok"] and count["count"] == REQUESTS + REQUESTS // 10, count
        frontend = server.child_pids()["frontend"]
        for _ in range(20):  # a rhythm first: a fresh policy counts its history as long gaps
            assert conn.call({"cmd": "Ping"})["ok"]
        slept = sleeps(frontend)
        for _ in range(REQUESTS):
            assert conn.call({"cmd": "Ping"})["ok"]
        per_ping = (sleeps(frontend) - slept) / REQUESTS
        assert per_ping < MAX_SLEEPS_PER_PING, f"the front end slept {per_ping:.2f} times a Ping"
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
    # the stop line tells what spinning did: the front end spun, and mostly found a message
    stopped = stop_line(server, "front end stopped")
    assert stopped["spins"] > REQUESTS / 2 and stopped["spin_hits"] > stopped["spins"] / 2
    assert stopped["spin_s"] > 0


def stop_line(server: ShardqServer, event: str) -> dict[str, Any]:
    [line] = [line for line in server.logs() if line.get("event") == event]
    return line


def pings_per_sleep(server: ShardqServer) -> float:
    """Sleeps of the front end per Ping, one Ping in flight at a time, after a rhythm."""
    host, port = server.tcp_address
    conn = TcpConnection(host, port)
    try:
        for _ in range(20):
            assert conn.call({"cmd": "Ping"})["ok"]
        frontend = server.child_pids()["frontend"]
        slept = sleeps(frontend)
        for _ in range(REQUESTS):
            assert conn.call({"cmd": "Ping"})["ok"]
        return (sleeps(frontend) - slept) / REQUESTS
    finally:
        conn.close()


def test_auto_spin_sleeps_while_the_machine_has_no_idle_cpu(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    """Busy loops, two more than the CPUs, keep more tasks runnable than "auto" allows (CPUs + 1):
    the same quick Pings that keep the front end awake above now find it asleep each time."""
    server = shardq_server(shards=2, env={"SHARDQ_SPIN_US": "auto"})
    hog = f"import time\nend = time.monotonic() + {HOG_S}\nwhile time.monotonic() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range((os.cpu_count() or 1) + 2)]
    try:
        time.sleep(0.2)  # the hogs are running
        per_ping = pings_per_sleep(server)
    finally:
        for proc in hogs:
            proc.kill()
            proc.wait()
    # Without spinning the front end sleeps about once a Ping (0.9); spinning, almost never.
    assert per_ping > MAX_SLEEPS_PER_PING, f"the front end slept {per_ping:.2f} times a Ping"
    assert server.stop() == 0, server.log_tail()
    assert stop_line(server, "front end stopped")["spins_crowded"] > REQUESTS / 2
