"""Queue-wide commands on a cold backlog, build against build (issue 22).

    python -m bench.wide_cold --build start=/path/to/old/shardq --build new=.venv/bin/shardq
                              [--jobs 200000,1000000] [--rounds 2] [--memory-mb 8]

Each round runs each build in turn (A, B, A, B) on a fresh `--shards 1` server whose shard
has a memory budget of `--memory-mb` (`SHARDQ_SHARD_MEMORY_MB`): one queue of N jobs of
priorities 0-2 (`{"i": n}` data, PUSHB of 1,000), nearly all of them cold. It records the
push (jobs/s, and the writer's and the shard's CPU µs per job: what a cold row costs to
write), then each queue-wide command in turn: wall ms, the shard's CPU ms (/proc utime +
stime), the jobs resident after it, and the writer's work for it: when its writes were
committed (ms after the command was sent until a durable push sent after its reply is
answered: the writer commits in order) and the writer's CPU ms meanwhile. Each command starts
with the writer idle (no `IDLE_CPU_S` of CPU in `IDLE_S`). CPU is what to compare on a shared
machine, though a writer reading a large file from disk waits more than it computes; the load
average is printed beside each run.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from typing import Any

from bench._scenarios import children, connect, start_server
from bench.cpu import cpu_seconds
from shardq.client import TcpConnection

QUEUE = "q"
BATCH = 1000
COMMANDS: list[tuple[str, dict[str, Any]]] = [
    ("GetJobs waiting limit 100", {"cmd": "GetJobs", "state": "waiting", "limit": 100}),
    ("GetJobs all offset 1000 limit 100 desc",
     {"cmd": "GetJobs", "offset": 1000, "limit": 100, "asc": False}),
    ("GetJobs prioritized limit 100 desc",
     {"cmd": "GetJobs", "state": "prioritized", "limit": 100, "asc": False}),
    ("Clean waiting grace 0 limit 1000",
     {"cmd": "Clean", "state": "waiting", "grace": 0, "limit": 1000}),
    ("Drain", {"cmd": "Drain"}),
]  # fmt: skip
SETTLE_S = 600.0
IDLE_S = 0.5  # the writer is idle after a window this long ...
IDLE_CPU_S = 0.02  # ... in which it spent less CPU than this (its ticks, the metrics)
PROBE = "probe"  # a queue of its own for the durable push that times the writer


def _stats(conn: TcpConnection) -> dict[str, Any]:
    stats: dict[str, Any] = conn.call({"cmd": "Stats"})["stats"]
    return stats


def _settle(conn: TcpConnection, total: int) -> int:
    """Wait until the cold count stops moving (the writer committed the pushes)."""
    deadline, last = time.monotonic() + SETTLE_S, -1
    while time.monotonic() < deadline:
        cold = int(_stats(conn).get("coldJobs", 0))
        if cold == last:
            return cold
        last = cold
        time.sleep(1.0)
    raise RuntimeError(f"the cold count of {total} jobs did not settle")


def _idle(pid: int) -> None:
    """Wait until process `pid` spends less than `IDLE_CPU_S` of CPU in `IDLE_S`."""
    deadline = time.monotonic() + SETTLE_S
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(IDLE_S)
        now = cpu_seconds(pid)
        if now - last < IDLE_CPU_S:
            return
        last = now
    raise RuntimeError(f"process {pid} did not go idle")


def _push(conn: TcpConnection, total: int) -> float:
    started = time.perf_counter()
    for start in range(0, total, BATCH):
        jobs = [{"data": {"i": i}, "priority": i % 3} for i in range(start, start + BATCH)]
        conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})
    return time.perf_counter() - started


def run(executable: str, total: int, memory_mb: int) -> dict[str, Any]:
    """One build, one backlog: the push and every command (module docstring)."""
    out: dict[str, Any] = {"load": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="wide-cold-") as data_dir:
        env = {"SHARDQ_SHARD_MEMORY_MB": str(memory_mb)}
        server, port = start_server(executable, 1, data_dir, env=env)
        try:
            conn = connect(port, server)
            conn.close()
            conn = TcpConnection("127.0.0.1", port, timeout=SETTLE_S)
            procs = dict((role, pid) for pid, role in children(server.pid))
            shard, writer = procs["shard0"], procs["writer"]
            before = (cpu_seconds(writer), cpu_seconds(shard))
            elapsed = _push(conn, total)
            out["cold"] = _settle(conn, total)
            out["push_per_s"] = total / elapsed
            out["writer_us"] = (cpu_seconds(writer) - before[0]) * 1e6 / total
            out["shard_us"] = (cpu_seconds(shard) - before[1]) * 1e6 / total
            for label, cmd in COMMANDS:
                _idle(writer)
                cpu, started = cpu_seconds(shard), time.perf_counter()
                wrote = cpu_seconds(writer)
                conn.call({**cmd, "queue": QUEUE})
                wall = (time.perf_counter() - started) * 1000
                spent = (cpu_seconds(shard) - cpu) * 1000
                out[label] = (wall, spent, int(_stats(conn).get("residentJobs", 0)))
                # A durable push sent now is answered once the commit holding it, or a later
                # one, is done: the writer applies its batches in order.
                conn.call({"cmd": "PUSH", "queue": PROBE, "data": {}, "durable": True})
                committed = (time.perf_counter() - started) * 1000
                out[f"{label} writer"] = (committed, (cpu_seconds(writer) - wrote) * 1000)
            conn.close()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(120)
    return out


def _report(name: str, total: int, result: dict[str, Any]) -> None:
    print(
        f"\n{name}, N = {total:,} ({result['cold']:,} cold), load {result['load']:.1f}:"
        f" push {result['push_per_s']:,.0f} jobs/s, writer {result['writer_us']:.1f} µs/job,"
        f" shard {result['shard_us']:.1f} µs/job",
        flush=True,
    )
    print(
        "| command | wall ms | shard CPU ms | resident after | committed after ms |"
        " writer CPU ms |\n|---|---:|---:|---:|---:|---:|"
    )
    for label, _ in COMMANDS:
        wall, cpu, resident = result[label]
        committed, wrote = result[f"{label} writer"]
        print(
            f"| {label} | {wall:,.0f} | {cpu:,.0f} | {resident:,} | {committed:,.0f}"
            f" | {wrote:,.0f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", action="append", required=True, help="name=executable")
    parser.add_argument("--jobs", default="200000,1000000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--memory-mb", type=int, default=8)
    args = parser.parse_args()
    builds = [tuple(b.split("=", 1)) for b in args.build]
    for total in (int(n) for n in args.jobs.split(",")):
        for _ in range(args.rounds):
            for name, executable in builds:
                _report(name, total, run(executable, total, args.memory_mb))


if __name__ == "__main__":
    main()
