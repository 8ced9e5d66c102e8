"""What forwarding costs a single push (docs/cluster.md "Forwarding"): latency through the node
that does not own the queue against the owner directly.

    python -m bench.forward [--pushes 2000] [--rounds 5] [--durable]

Two `shardq start` nodes (1 shard each) on one throwaway PostgreSQL
(`bench._pg_server`, default settings) on this machine. One client connection to each node;
each round sends `--pushes` single PUSHes, one at a time (send, wait for the reply), for a
queue node B owns: through B (direct) and through A (forwarded to B over A's link), the two
alternating round by round so that the machine's load weighs on both alike. The table gives
p50 and p99 per round kind over all rounds, in microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.request
from typing import Any

import psycopg

from bench._pg_server import PostgresServer
from bench._server import ShardqProcess, free_port
from shardq.client import TcpConnection
from shardq.cluster import partition_of

PARTS = 16


def _node(name: str, url: str) -> tuple[ShardqProcess, int]:
    http = free_port()
    env = {**os.environ, "SHARDQ_STORAGE_URL": url, "SHARDQ_NODE_ID": name,
           "SHARDQ_PARTITIONS": str(PARTS),
           "SHARDQ_LEASE_MS": "3000"}  # fmt: skip
    return ShardqProcess("1", "--http-port", str(http), env=env), http


def _split(http: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/ready", timeout=10) as reply:
        body: dict[str, Any] = json.loads(reply.read())
    return bool(body.get("cluster", {}).get("held") == PARTS // 2)


def _queue_of(url: str, node: str) -> str:
    with psycopg.connect(url) as db:
        rows = db.execute("SELECT partition, owner FROM partition_leases").fetchall()
    owners = {int(p): str(o) for p, o in rows}
    return next(f"q{i}" for i in range(10_000) if owners.get(partition_of(f"q{i}", PARTS)) == node)


def _round(conn: TcpConnection, queue: str, pushes: int, durable: bool) -> list[float]:
    cmd = {"cmd": "PUSH", "queue": queue, "data": {"n": 1}, "durable": durable}
    times = []
    for _ in range(pushes):
        start = time.perf_counter()
        conn.call(cmd)
        times.append((time.perf_counter() - start) * 1e6)
    return times


def _wait_split(http_a: int, http_b: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if _split(http_a) and _split(http_b):
                time.sleep(1.0)  # both front ends re-read the map
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the nodes did not split the partitions within 30 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pushes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--durable", action="store_true")
    args = parser.parse_args()
    pg = PostgresServer().start()
    nodes: list[ShardqProcess] = []
    try:
        with psycopg.connect(pg.url(), autocommit=True) as db:
            db.execute("CREATE DATABASE fwd")
        url = pg.url("fwd")
        a, http_a = _node("node-a", url)
        nodes.append(a)
        b, http_b = _node("node-b", url)
        nodes.append(b)
        _wait_split(http_a, http_b)
        queue = _queue_of(url, "node-b")
        results: dict[str, list[float]] = {"direct": [], "forwarded": []}
        with (
            TcpConnection("127.0.0.1", b.tcp_port, timeout=30) as direct,
            TcpConnection("127.0.0.1", a.tcp_port, timeout=30) as forwarded,
        ):
            _round(direct, queue, 200, args.durable)  # warm both paths up
            _round(forwarded, queue, 200, args.durable)
            for _ in range(args.rounds):
                results["direct"] += _round(direct, queue, args.pushes, args.durable)
                results["forwarded"] += _round(forwarded, queue, args.pushes, args.durable)
        kind = "durable single push" if args.durable else "single push"
        print(f"| {kind} | p50 µs | p99 µs | pushes |")
        print("|---|---|---|---|")
        for name, times in results.items():
            times.sort()
            p99 = times[int(len(times) * 0.99)]
            print(f"| {name} | {statistics.median(times):.0f} | {p99:.0f} | {len(times)} |")
    finally:
        for node in nodes:
            node.stop()
        pg.stop()


if __name__ == "__main__":
    main()
