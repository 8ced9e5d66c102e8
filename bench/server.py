"""Throughput of a real `shardq start` over TCP (bunqueue framing), one client process.

    python -m bench.server [--shards 1 auto] [--jobs 20000] [--repeats 3] [--json PATH]

Scenarios, each buffered and durable, on 1 queue and on 8 queues: single push (one request in
flight), pipelined push (100 in flight), PUSHB of 100, and push->pull->ack (PUSHB 100, then a
worker loop of PULLB 100 + ACKB). The client and the server share the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench._server import ShardqProcess
from shardq.client import TcpConnection

Scenario = Callable[[TcpConnection, list[str], int, bool], int]


def push_single(conn: TcpConnection, queues: list[str], n: int, durable: bool) -> int:
    for i in range(n):
        conn.call({"cmd": "PUSH", "queue": queues[i % len(queues)], "data": {"i": i},
                   "durable": durable})  # fmt: skip
    return n


def push_pipelined(conn: TcpConnection, queues: list[str], n: int, durable: bool) -> int:
    cmds = [
        {"cmd": "PUSH", "queue": queues[i % len(queues)], "data": {"i": i}, "durable": durable}
        for i in range(n)
    ]
    conn.call_many(cmds, window=100)
    return n


def push_bulk(conn: TcpConnection, queues: list[str], n: int, durable: bool) -> int:
    cmds = [
        {"cmd": "PUSHB", "queue": queues[b % len(queues)],
         "jobs": [{"data": {"i": i}, "durable": durable} for i in range(100)]}
        for b in range(n // 100)
    ]  # fmt: skip
    conn.call_many(cmds, window=8)
    return (n // 100) * 100


def push_pull_ack(conn: TcpConnection, queues: list[str], n: int, durable: bool) -> int:
    push_bulk(conn, queues, n, durable)
    done = 0
    for queue in queues:
        while True:
            reply = conn.call({"cmd": "PULLB", "queue": queue, "count": 100, "owner": "bench"})
            if not reply["jobs"]:
                break
            ids = [job["id"] for job in reply["jobs"]]
            conn.call({"cmd": "ACKB", "ids": ids, "tokens": reply["tokens"]})
            done += len(ids)
    return done


SCENARIOS: dict[str, tuple[Scenario, int]] = {
    # name: (function, share of --jobs it runs: single pushes are slow, keep them short)
    "single push": (push_single, 10),
    "pipelined push (100 in flight)": (push_pipelined, 1),
    "PUSHB of 100": (push_bulk, 1),
    "push->pull->ack (PUSHB, PULLB 100, ACKB)": (push_pull_ack, 1),
}


def run_scenario(port: int, fn: Scenario, queues: list[str], n: int, durable: bool) -> float:
    with TcpConnection("127.0.0.1", port) as conn:
        start = time.perf_counter()
        done = fn(conn, queues, n, durable)
        return done / (time.perf_counter() - start)


def bench_server(shards: str, jobs: int, repeats: int) -> list[dict[str, Any]]:
    server = ShardqProcess(shards)
    rows: list[dict[str, Any]] = []
    try:
        for nq in (1, 8):
            for durable in (False, True):
                for k, (name, (fn, divisor)) in enumerate(SCENARIOS.items()):
                    rates = []
                    for r in range(repeats):
                        # A fresh, deterministic set of queues per run: no leftovers between runs.
                        queues = [f"b{k}-{nq}-{int(durable)}-{r}-{q}" for q in range(nq)]
                        rates.append(run_scenario(server.tcp_port, fn, queues,
                                                  jobs // divisor, durable))  # fmt: skip
                    rows.append({
                        "shards": server.ready.get("shards", shards), "queues": nq,
                        "mode": "durable" if durable else "buffered", "scenario": name,
                        "median": statistics.median(rates), "min": min(rates), "max": max(rates),
                    })  # fmt: skip
                    print_row(rows[-1])
    finally:
        server.stop()
    return rows


def print_row(row: dict[str, Any]) -> None:
    print(
        f"| {row['shards']} | {row['queues']} | {row['mode']} | {row['scenario']} | "
        f"{row['median']:,.0f} | {row['min']:,.0f} | {row['max']:,.0f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", nargs="+", default=["1", "auto"])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    print(f"# python {platform.python_version()}, {os.cpu_count()} CPUs, jobs={args.jobs}")
    print("| shards | queues | mode | scenario | median jobs/s | min | max |")
    print("|---|---:|---|---|---:|---:|---:|")
    rows = [row for s in args.shards for row in bench_server(s, args.jobs, args.repeats)]
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"cpus": os.cpu_count(), "jobs": args.jobs, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
