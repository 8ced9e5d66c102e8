"""Spinning settings side by side: one request's latency, and the CPU of an idle or trickled server.

    python -m bench.spin [--configs 0,auto,200] [--rounds 3] [--requests 2000]
                         [--idle-s 10] [--trickle-ms 5] [--json PATH]

Each round starts, for each `spin_us` value in turn (the configs alternate, so that they share
the machine's conditions), a fresh `shardq start --shards auto` with `SHARDQ_SPIN_US` set, and:

1. latency: the sequential round trips of `bench.latency` (Ping, Count, PUSH, PUSH durable),
   p50 and p99, and per request the server's CPU time and its sleeps (voluntary context
   switches of every thread of every server process: the wake-ups spinning avoids; unlike
   the latency, this count hardly depends on what else runs on the machine);
2. idle: after a second of quiet, the CPU seconds (user + system, /proc/PID/stat) that the
   supervisor and all its children spend over `--idle-s` seconds with no client at all;
3. trickle: the same CPU seconds (and sleeps) while one client sends one PUSH every
   `--trickle-ms`.

The table gives, per config, the median over the rounds, and each round's values for the CPU.
Extra `SHARDQ_*` variables in the environment (e.g. `SHARDQ_SPIN_AUTO_MAX_US`) reach every
server. A config `auto/R` is `auto` with `SHARDQ_SPIN_AUTO_MAX_RUNNABLE=R`; `default` leaves
`SHARDQ_SPIN_US` unset (the build's default). Each round's 1-minute load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench._server import ShardqProcess
from bench.cpu import cpu_seconds
from bench.latency import COMMANDS, _summary
from shardq.client import TcpConnection

SETTLE_S = 1.0


def _server_pids(server: ShardqProcess) -> list[int]:
    pid = server.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [pid, *(int(c) for c in f.read().split())]


def _sleeps(pid: int) -> int:
    """Voluntary context switches of every thread of `pid`: how often it went to sleep."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def _usage(server: ShardqProcess) -> tuple[float, int]:
    """CPU seconds and sleeps so far of the supervisor and every child it has now."""
    pids = _server_pids(server)
    return sum(cpu_seconds(p) for p in pids), sum(_sleeps(p) for p in pids)


def _latency(server: ShardqProcess, requests: int) -> list[dict[str, Any]]:
    """`bench.latency`'s sequential round trips, with the server's CPU and sleeps per request."""
    conn = TcpConnection("127.0.0.1", server.tcp_port)
    rows = []
    try:
        for label, command in COMMANDS.items():
            conn.call(command)  # warm: the queue exists, the code paths are loaded
            samples = []
            cpu, sleeps = _usage(server)
            for _ in range(requests):
                started = time.perf_counter()
                conn.call(command)
                samples.append(time.perf_counter() - started)
            cpu_after, sleeps_after = _usage(server)
            rows.append({"path": label, **_summary(samples),
                         "cpu_us": (cpu_after - cpu) * 1e6 / requests,
                         "sleeps": (sleeps_after - sleeps) / requests})  # fmt: skip
    finally:
        conn.close()
    return rows


def _idle(server: ShardqProcess, seconds: float) -> float:
    time.sleep(SETTLE_S)
    before, _ = _usage(server)
    time.sleep(seconds)
    return _usage(server)[0] - before


def _trickle(server: ShardqProcess, seconds: float, every_s: float) -> tuple[float, int, int]:
    """CPU seconds, sleeps and requests sent while one PUSH goes out every `every_s`."""
    conn = TcpConnection("127.0.0.1", server.tcp_port)
    try:
        time.sleep(SETTLE_S)
        before, slept = _usage(server)
        started = time.monotonic()
        sent = 0
        while time.monotonic() < started + seconds:
            conn.call({"cmd": "PUSH", "queue": "trickle", "data": {"n": sent}})
            sent += 1
            time.sleep(max(0.0, started + sent * every_s - time.monotonic()))
        cpu, sleeps = _usage(server)
        return cpu - before, sleeps - slept, sent
    finally:
        conn.close()


def spin_env(spin: str) -> dict[str, str]:
    """The environment of a server for a config: `N`, `auto`, `auto/R` (`auto` with
    `SHARDQ_SPIN_AUTO_MAX_RUNNABLE=R`), or `default` (no `SHARDQ_SPIN_US` at all)."""
    env = {**os.environ, "SHARDQ_SYNCHRONOUS": "normal"}
    env.pop("SHARDQ_SPIN_US", None)
    value, _, runnable = spin.partition("/")
    if value != "default":
        env["SHARDQ_SPIN_US"] = value
    if runnable:
        env["SHARDQ_SPIN_AUTO_MAX_RUNNABLE"] = runnable
    return env


def one(spin: str, args: argparse.Namespace) -> dict[str, Any]:
    load = os.getloadavg()[0]
    server = ShardqProcess("auto", env=spin_env(spin))
    try:
        rows = _latency(server, args.requests)
        idle = _idle(server, args.idle_s)
        trickle, trickle_sleeps, sent = _trickle(server, args.idle_s, args.trickle_ms / 1000)
    finally:
        server.stop()
    return {"spin_us": spin, "load": load, "rows": rows, "idle_cpu_s": idle,
            "trickle_cpu_s": trickle, "trickle_sent": sent,
            "trickle_sleeps": trickle_sleeps}  # fmt: skip


def render(results: list[dict[str, Any]], configs: list[str], args: argparse.Namespace) -> str:
    paths = [r["path"] for r in results[0]["rows"]]
    head = " | ".join(f"{p} p50 / p99 µs" for p in paths)
    lines = [
        f"{args.rounds} rounds, {args.requests} sequential requests per path, idle and trickle "
        f"over {args.idle_s:g} s (trickle: one PUSH every {args.trickle_ms:g} ms); medians",
        "",
        f"| spin_us | {head} | idle CPU s | trickle CPU s |",
        "|---|" + "---:|" * (len(paths) + 2),
    ]
    sleeps_cells: dict[str, list[str]] = {}
    trickle_cells: dict[str, str] = {}
    for spin in configs:
        mine = [r for r in results if r["spin_us"] == spin]
        cells = []
        for i in range(len(paths)):
            p50 = statistics.median(r["rows"][i]["p50_us"] for r in mine)
            p99 = statistics.median(r["rows"][i]["p99_us"] for r in mine)
            cells.append(f"{p50:,.0f} / {p99:,.0f}")
        for i in range(len(paths)):
            per = [(r["rows"][i]["sleeps"], r["rows"][i]["cpu_us"]) for r in mine]
            sleeps_cells.setdefault(spin, []).append(
                f"{statistics.median(x for x, _ in per):.2f} / "
                f"{statistics.median(y for _, y in per):,.0f}"
            )
        trickle_cells[spin] = (
            f"{statistics.median(r['trickle_sleeps'] / r['trickle_sent'] for r in mine):.2f} / "
            f"{statistics.median(r['trickle_cpu_s'] * 1e6 / r['trickle_sent'] for r in mine):,.0f}"
        )
        idle = [r["idle_cpu_s"] for r in mine]
        trickle = [r["trickle_cpu_s"] for r in mine]
        lines.append(
            f"| {spin} | {' | '.join(cells)} | {statistics.median(idle):.3f} "
            f"({', '.join(f'{x:.2f}' for x in idle)}) | {statistics.median(trickle):.3f} "
            f"({', '.join(f'{x:.2f}' for x in trickle)}) |"
        )
    lines += [
        "",
        "1-minute load average at each server's start: "
        + "; ".join(f"{r['spin_us']} {r['load']:.1f}" for r in results),
        "",
        "Server sleeps (voluntary context switches, all processes) / server CPU µs, per request:",
        "",
        f"| spin_us | {' | '.join(paths)} | trickle PUSH |",
        "|---|" + "---:|" * (len(paths) + 1),
        *(
            f"| {spin} | {' | '.join(cells)} | {trickle_cells[spin]} |"
            for spin, cells in sleeps_cells.items()
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--configs", default="0,auto,200")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--trickle-ms", type=float, default=5.0)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    if args.requests < 10 or args.rounds < 1 or args.idle_s <= 0 or args.trickle_ms <= 0:
        parser.error("--requests >= 10, --rounds >= 1, --idle-s and --trickle-ms > 0")
    configs = [c for c in args.configs.split(",") if c]
    results = []
    for k in range(args.rounds):
        for spin in configs:
            print(f"[bench spin] round {k + 1}, spin_us={spin}", file=sys.stderr, flush=True)
            results.append(one(spin, args))
    print(render(results, configs, args))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
