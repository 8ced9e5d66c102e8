"""How long a node takes to load the partitions it gains, and the hand-over gap on SIGTERM
(docs/cluster.md, "Taking over").

    python -m bench.takeover [--jobs 20000] [--shards 1] [--lease-ms 1500] [--repeats 3]

Each repeat: two nodes start on a fresh database of a throwaway PostgreSQL
(`bench._pg_server`) and split the partitions; `--jobs` durable jobs are pushed (PUSHB, 500 a
batch) into queues of node A's partitions; A stops with SIGTERM. Read from the two nodes' JSON
logs (one machine, one clock): B's `partitions loaded` lines (jobs, milliseconds, summed over
its shards, which load in parallel, so the longest is the wall time) and the gap from A's
`partitions released` to B's last `partitions loaded`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from datetime import datetime
from typing import Any

import psycopg

from bench._pg_server import PostgresServer
from bench._server import ShardqProcess, log_entries
from shardq.client import TcpConnection
from shardq.cluster import partition_of

PARTS = 16
BATCH = 500


def _node(name: str, url: str, shards: int, lease_ms: int) -> ShardqProcess:
    env = {"SHARDQ_STORAGE_URL": url, "SHARDQ_LEASE_MS": str(lease_ms),
           "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name}  # fmt: skip
    return ShardqProcess(str(shards), env={**os.environ, **env})


def _owners(url: str) -> dict[int, str]:
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT partition, owner FROM partition_leases WHERE expires_at > now()"
        ).fetchall()
    return {int(p): str(o) for p, o in rows}


def _stamp(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()


def _wait_split(url: str, timeout: float = 30.0) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owners = _owners(url)
        held = [sum(1 for o in owners.values() if o == n) for n in ("a", "b")]
        if held == [PARTS // 2, PARTS // 2]:
            return owners
        time.sleep(0.1)
    raise RuntimeError(f"the nodes did not split the partitions: {_owners(url)}")


def _one(server: PostgresServer, jobs: int, shards: int, lease_ms: int) -> dict[str, float]:
    name = f"tk_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.url(), autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name}")
    url = server.url(name)
    a = _node("a", url, shards, lease_ms)
    b = _node("b", url, shards, lease_ms)
    try:
        owners = _wait_split(url)
        queues = [
            q for q in (f"load{i}" for i in range(200)) if owners[partition_of(q, PARTS)] == "a"
        ]
        with TcpConnection("127.0.0.1", a.tcp_port, timeout=60) as conn:
            for n in range(0, jobs, BATCH):
                batch = [{"data": {"n": n + i}} for i in range(min(BATCH, jobs - n))]
                queue = queues[(n // BATCH) % len(queues)]
                conn.call({"cmd": "PUSHB", "queue": queue, "jobs": batch, "durable": True})
        a.stop()
        deadline = time.monotonic() + 30
        loads: list[dict[str, Any]] = []
        while sum(int(e["jobs"]) for e in loads) < jobs and time.monotonic() < deadline:
            time.sleep(0.1)
            loads = [e for e in log_entries(b.dir / "server.log")
                     if e.get("event") == "partitions loaded"]  # fmt: skip
        released = next(
            e for e in log_entries(a.dir / "server.log") if e.get("event") == "partitions released"
        )
        loaded = sum(int(e["jobs"]) for e in loads)
        if loaded < jobs:
            raise RuntimeError(f"b loaded {loaded} of {jobs} jobs")
        return {
            "jobs": loaded,
            "load_ms": max(float(e["ms"]) for e in loads),
            "gap_ms": (max(_stamp(e) for e in loads) - _stamp(released)) * 1000,
        }
    finally:
        a.stop()
        b.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--lease-ms", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    server = PostgresServer().start()
    try:
        runs = [_one(server, args.jobs, args.shards, args.lease_ms) for _ in range(args.repeats)]
    finally:
        server.stop()
    for run in runs:
        per_k = run["load_ms"] / run["jobs"] * 1000
        print(f"jobs {run['jobs']:.0f}  load {run['load_ms']:.0f} ms ({per_k:.1f} ms per 1,000)"
              f"  release -> loaded {run['gap_ms']:.0f} ms")  # fmt: skip
    per_k = statistics.median(r["load_ms"] / r["jobs"] * 1000 for r in runs)
    gap = statistics.median(r["gap_ms"] for r in runs)
    print(f"median: {per_k:.1f} ms per 1,000 jobs loaded; hand-over gap {gap:.0f} ms")


if __name__ == "__main__":
    main()
