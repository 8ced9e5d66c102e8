"""Where spinning's CPU goes: per process, per job, spin settings alternated in one run.

    python -m bench.spin_cost [--configs 0,auto] [--rounds 3] [--jobs 20000]
                              [--scenarios dbulk,bulk,pipe,single,dsingle] [--json PATH]

For each round, each scenario and each `spin_us` value in turn (so that the settings share the
machine's conditions), a fresh `shardq start --shards auto` with `SHARDQ_SPIN_US` set runs one
raw TCP client:

- `dbulk`: durable PUSHB of 100, one call at a time (the shape of `compare`'s durable_bulk_100);
- `bulk`: the same, buffered;
- `pipe`: PUSH pipelined, 100 in flight;
- `single` / `dsingle`: one PUSH at a time, buffered / durable (a tenth of `--jobs`);
- `bq_dbulk`, `bq_single`, `bq_dsingle`: durable bulk, single and durable single through
  bunqueue's Python client (`bench.compare._bq`), as `compare`'s bunqueue-client rows.

Per process (supervisor, front end, each shard, writer, and the client itself) it reads the CPU
time (user + system, /proc) and the sleeps (voluntary context switches) before and after, and
prints them per job, with the rate. A config `auto/N` is `auto` with
`SHARDQ_SPIN_AUTO_MAX_RUNNABLE=N`. Extra `SHARDQ_*` variables in the environment reach every
server; `SHARDQ_SPIN_US` is set per config.
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

from bench._server import ShardqProcess, log_entries
from bench.cpu import cpu_seconds
from bench.spin import _sleeps
from shardq.client import TcpConnection

BATCH = 100
SCENARIOS = ("dbulk", "bulk", "pipe", "single", "dsingle", "bq_dbulk", "bq_single", "bq_dsingle")


def _roles(server: ShardqProcess) -> dict[str, int]:
    pid = server.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = sorted(int(c) for c in f.read().split())
    roles = {"sup": pid}
    shard = 0
    for kid in kids:
        argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
        if b"shardq.runtime.shard" in argv:
            roles[f"shard{shard}"] = kid
            shard += 1
        elif b"shardq.runtime.writer" in argv:
            roles["writer"] = kid
        elif b"shardq.runtime.frontend" in argv:
            roles["frontend"] = kid
    return roles


def _snapshot(roles: dict[str, int]) -> dict[str, tuple[float, int]]:
    got = {name: (cpu_seconds(pid), _sleeps(pid)) for name, pid in roles.items()}
    got["client"] = (time.process_time(), _sleeps(os.getpid()))
    return got


def _run(conn: TcpConnection, port: int, scenario: str, jobs: int) -> int:
    durable = scenario.removeprefix("bq_").startswith("d")
    if scenario.startswith("bq_"):
        return _bunqueue_client(port, scenario, jobs, durable)
    if scenario in ("dbulk", "bulk"):
        for b in range(jobs // BATCH):
            extra = {"durable": True} if durable else {}
            jobs_of_call = [{"data": {"i": b * BATCH + k}, **extra} for k in range(BATCH)]
            conn.call({"cmd": "PUSHB", "queue": "q", "jobs": jobs_of_call})
        return jobs // BATCH * BATCH
    if scenario == "pipe":
        pushes = ({"cmd": "PUSH", "queue": "q", "data": {"i": i}} for i in range(jobs))
        conn.call_many(pushes, window=BATCH)
        return jobs
    n = max(100, jobs // 10)
    for i in range(n):
        conn.call({"cmd": "PUSH", "queue": "q", "data": {"i": i}, "durable": durable})
    return n


def _bunqueue_client(port: int, scenario: str, jobs: int, durable: bool) -> int:
    """The same through bunqueue's own Python client (`compare`'s bunqueue-client rows)."""
    from bench.compare._bq import bqc_bulk, bqc_single

    if scenario.endswith("bulk"):
        bqc_bulk(port, ["q"], jobs, BATCH, durable)
        return jobs // BATCH * BATCH
    n = max(100, jobs // 10)
    bqc_single(port, ["q"], n, durable)
    return n


STOPPED = ("front end stopped", "shard stopped", "writer stopping")


def _spins(server: ShardqProcess) -> dict[str, int]:
    """Spins of the whole run (warm-up included) by role, from the processes' stop lines."""
    got: dict[str, int] = {}
    for entry in log_entries(server.dir / "server.log"):
        if entry.get("event") in STOPPED and "spins" in entry:
            role = str(entry["event"]).split(" st")[0]
            got[role] = got.get(role, 0) + int(entry["spins"])
    return got


def one(spin: str, scenario: str, jobs: int) -> dict[str, Any]:
    value, _, runnable = spin.partition("/")
    env = {**os.environ, "SHARDQ_SPIN_US": value, "SHARDQ_SYNCHRONOUS": "normal"}
    if runnable:
        env["SHARDQ_SPIN_AUTO_MAX_RUNNABLE"] = runnable
    server = ShardqProcess("auto", env=env)
    try:
        conn = TcpConnection("127.0.0.1", server.tcp_port)
        try:
            warm = ({"cmd": "PUSH", "queue": "warm", "data": {"i": i}} for i in range(1000))
            conn.call_many(warm, window=BATCH)
            time.sleep(0.5)
            roles = _roles(server)
            before = _snapshot(roles)
            started = time.perf_counter()
            done = _run(conn, server.tcp_port, scenario, jobs)
            elapsed = time.perf_counter() - started
            after = _snapshot(roles)
        finally:
            conn.close()
    finally:
        server.stop()
    spins = _spins(server)
    us = {k: (after[k][0] - before[k][0]) * 1e6 / done for k in before}
    sleeps = {k: (after[k][1] - before[k][1]) / done for k in before}
    return {"spin_us": spin, "scenario": scenario, "jobs": done, "rate": done / elapsed,
            "us": us, "sleeps": sleeps, "spins": spins}  # fmt: skip


def render(results: list[dict[str, Any]]) -> str:
    names = list(results[0]["us"])
    out = [
        "CPU µs per job by process (sleeps per job in brackets), server = all but the client",
        "",
        "| scenario | spin | jobs/s | server µs | " + " | ".join(names) + " | spins, whole run |",
        "|---|---|---:|---:|" + "---:|" * len(names) + "---|",
    ]
    for r in results:
        server = sum(v for k, v in r["us"].items() if k != "client")
        cells = " | ".join(f"{r['us'][k]:.1f} ({r['sleeps'][k]:.2f})" for k in names)
        head = f"| {r['scenario']} | {r['spin_us']} | {r['rate']:,.0f} | {server:.1f}"
        out.append(f"{head} | {cells} | {r['spins']} |")
    out += ["", "medians: jobs/s, server µs/job"]
    for scenario in dict.fromkeys(r["scenario"] for r in results):
        for spin in dict.fromkeys(r["spin_us"] for r in results):
            mine = [r for r in results if r["scenario"] == scenario and r["spin_us"] == spin]
            rates = [r["rate"] for r in mine]
            servers = [sum(v for k, v in r["us"].items() if k != "client") for r in mine]
            out.append(
                f"- {scenario} {spin}: {statistics.median(rates):,.0f} jobs/s "
                f"({min(rates):,.0f}-{max(rates):,.0f}), server {statistics.median(servers):.1f} "
                f"µs/job ({min(servers):.1f}-{max(servers):.1f})"
            )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="0,auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    configs = args.configs.split(",")
    results = []
    for _ in range(args.rounds):
        for scenario in args.scenarios.split(","):
            for spin in configs:
                results.append(one(spin, scenario, args.jobs))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(os.getloadavg())
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
