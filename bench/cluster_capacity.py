"""What one job costs a cluster of shardq nodes on one PostgreSQL, and what that allows.

    python -m bench.cluster_capacity [--nodes 1,2,3] [--seconds 8] [--repeats 2]
        [--queues 8] [--node-cores 8] [--pg-cores 8]

For each node count N: a fresh database on a throwaway PostgreSQL (`bench._pg_server`, its
default settings: fsync on, synchronous_commit on), N real `shardq start --shards 1` nodes on
it (their own ports and data dirs), and, once every node holds its share
of the partitions, one client per node that runs rounds of 20 PUSHB of 100 (8 in flight), then
PULLB 100 + ACKB until the queue is empty, on queues of partitions that node holds, so that no
request is forwarded. After `--seconds` the clients finish their round, the processes settle
(everything committed), and the bench reads:

- server CPU per job: every process of every node (front end, shard, writer, supervisor);
- PostgreSQL CPU per job: the postmaster and all its children (backends, WAL writer, ...);
- WAL bytes per job: `pg_current_wal_lsn()` before and after.

CPU time barely moves when other work shares the machine; jobs/s does, and on a 2-core machine
N nodes and PostgreSQL share the same two cores, so the jobs/s column is not a scaling result.
The capacity model at the end uses only the per-job costs: with C cores per node and P cores
for PostgreSQL, N nodes can serve at most

    min(N * min(C / server_cpu, 1 / writer_cpu, 1 / frontend_cpu), P / pg_cpu, W / wal_bytes)

jobs/s (CPU in seconds per job, W the WAL bytes per second PostgreSQL's disk and replicas take,
`--wal-mbps`), assuming: the work per job stays what it was measured at (no cross-node
traffic: each client talks to the owner of its queues; a forwarded request costs more); the
shards scale with the cores of a node (one shard per core), but each node has one writer and
one front end process, each at most one core; PostgreSQL's CPU per job scales with its cores.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg

from bench._pg_server import PostgresServer
from bench._server import ShardqProcess
from bench.cpu import ROLES, children, cpu_seconds
from shardq.client import TcpConnection
from shardq.cluster import partition_of

_CONVERGE_TIMEOUT_S = 60.0
_IDLE_CPU_S = 0.1


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants (a node's supervisor and its children)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


def _node_cpu(pids: list[int]) -> float:
    total = 0.0
    for p in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
    return total


def _wal_lsn(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _held(port: int, node_id: str) -> tuple[int, int, int]:
    """(partitions this node holds, live nodes, partitions in all) from ClusterStatus."""
    with TcpConnection("127.0.0.1", port) as conn:
        reply = conn.call({"cmd": "ClusterStatus"})
    nodes = [n for n in reply["nodes"] if n["alive"]]
    mine = next((n["partitions"] for n in nodes if n["id"] == node_id), 0)
    return int(mine), len(nodes), int(reply["partitions"])


def _wait_converged(nodes: list[ShardqProcess], ids: list[str]) -> None:
    deadline = time.monotonic() + _CONVERGE_TIMEOUT_S
    while time.monotonic() < deadline:
        views = [_held(n.tcp_port, i) for n, i in zip(nodes, ids, strict=True)]
        total = views[0][2]
        # Each node aims at ceil(total / n): all but one may hold that, the last the rest.
        floor = total - (len(nodes) - 1) * -(-total // len(nodes))
        held = [mine for mine, _, _ in views]
        live = all(n == len(nodes) for _, n, _ in views)
        if live and sum(held) == total and min(held) >= floor:
            return
        time.sleep(0.5)
    raise RuntimeError(f"nodes did not share the partitions in {_CONVERGE_TIMEOUT_S}s")


def _owned_partitions(port: int) -> set[int]:
    """The partitions the node on `port` serves: those it does not answer MOVED for (on a
    `NoForward` connection: otherwise it forwards the others)."""
    with TcpConnection("127.0.0.1", port) as conn:
        conn.call({"cmd": "NoForward"})
        reply = conn.call({"cmd": "ClusterStatus"})
        total = int(reply["partitions"])
        owned = set()
        for p in range(total):
            queue = _queue_in(p, total, 0)
            answer = conn.call({"cmd": "Count", "queue": queue}, check=False)
            if answer.get("ok"):
                owned.add(p)
    return owned


def _queue_in(partition: int, partitions: int, start: int) -> str:
    """A queue name that hashes to `partition`, searching from suffix `start`."""
    k = start
    while True:
        name = f"cap{k}"
        if partition_of(name, partitions) == partition:
            return name
        k += 1


def _queues_for(port: int, spread: int) -> Iterator[str]:
    """An endless supply of fresh queue names, in `spread` of the partitions the node holds."""
    with TcpConnection("127.0.0.1", port) as conn:
        total = int(conn.call({"cmd": "ClusterStatus"})["partitions"])
    chosen = set(sorted(_owned_partitions(port))[:spread])
    for k in itertools.count():
        name = f"cap{port}-{k}"
        if partition_of(name, total) in chosen:
            yield name


def _rounds(port: int, queues: Iterator[str], stop: threading.Event, done: list[int]) -> None:
    with TcpConnection("127.0.0.1", port) as conn:
        conn.call({"cmd": "NoForward"})  # a moved partition fails the run, never forwards
        while not stop.is_set():
            queue = next(queues)
            pushes = [
                {"cmd": "PUSHB", "queue": queue, "jobs": [{"data": {"i": i}} for i in range(100)]}
                for _ in range(20)
            ]
            for reply in conn.call_many(pushes, window=8):
                if not reply.get("ok"):
                    raise RuntimeError(f"PUSHB refused: {reply}")
            while reply := conn.call({"cmd": "PULLB", "queue": queue, "count": 100,
                                      "owner": "bench"}):  # fmt: skip
                if not reply.get("jobs"):
                    break
                ids = [job["id"] for job in reply["jobs"]]
                conn.call({"cmd": "ACKB", "ids": ids, "tokens": reply["tokens"]})
                done[0] += len(ids)


def _settle(pids: list[int], pg: PostgresServer, quiet_s: float = 1.0) -> None:
    """Wait until the nodes and PostgreSQL are nearly idle: everything sent is committed. The
    lease threads keep renewing, so nearly idle is under `_IDLE_CPU_S` per `quiet_s`."""
    deadline = time.monotonic() + 60.0
    last = _node_cpu(pids) + pg.cpu_seconds()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = _node_cpu(pids) + pg.cpu_seconds()
        if now - last < _IDLE_CPU_S:
            return
        last = now


def run_once(pg: PostgresServer, count: int, seconds: float, queues: int) -> dict[str, Any]:
    name = f"cap_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg.url(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = pg.url(name)
    env = {**os.environ, "SHARDQ_STORAGE_URL": url,
           "SHARDQ_LEASE_MS": "3000"}  # fmt: skip
    ids = [f"n{i}" for i in range(count)]
    nodes: list[ShardqProcess] = []
    try:
        for node_id in ids:
            nodes.append(ShardqProcess("1", env={**env, "SHARDQ_NODE_ID": node_id}))
        _wait_converged(nodes, ids)
        trees = [_tree(n.proc.pid) for n in nodes]
        everyone = [p for t in trees for p in t]
        roles = {r: [p for n in nodes for p in children(n.proc.pid)[r]] for r in ROLES}
        _settle(everyone, pg)
        cpu0, pg0, wal0 = _node_cpu(everyone), pg.cpu_seconds(), _wal_lsn(url)
        role0 = {r: _node_cpu(pids) for r, pids in roles.items()}
        stop, done = threading.Event(), [[0] for _ in nodes]
        clients = [
            threading.Thread(target=_rounds, args=(n.tcp_port, _queues_for(n.tcp_port, queues),
                                                    stop, d))
            for n, d in zip(nodes, done, strict=True)
        ]  # fmt: skip
        started = time.perf_counter()
        for c in clients:
            c.start()
        time.sleep(seconds)
        stop.set()
        for c in clients:
            c.join()
        elapsed = time.perf_counter() - started
        _settle(everyone, pg)
        cpu, pgcpu, wal = _node_cpu(everyone) - cpu0, pg.cpu_seconds() - pg0, _wal_lsn(url) - wal0
        spent = {r: _node_cpu(pids) - role0[r] for r, pids in roles.items()}
    finally:
        for n in nodes:
            n.stop()
    jobs = sum(d[0] for d in done)
    return {
        "jobs": jobs,
        "jobs_per_s": jobs / elapsed,
        "server_us": cpu / jobs * 1e6,
        "pg_us": pgcpu / jobs * 1e6,
        "wal_bytes": wal / jobs,
        **{f"{r}_us": spent[r] / jobs * 1e6 for r in ROLES},
    }


def _model(
    rows: dict[int, dict[str, float]], node_cores: int, pg_cores: int, wal_mbps: float
) -> None:
    """Print the capacity model from the per-job costs measured with the most nodes."""
    worst = rows[max(rows)]
    # One writer and one front end process per node: each is one core at most.
    single = max(worst["writer_us"], worst["frontend_us"])
    node = min(node_cores / worst["server_us"], 1 / single) * 1e6
    pg_bound = pg_cores / worst["pg_us"] * 1e6
    wal_bound = wal_mbps * 1e6 / worst["wal_bytes"]
    print()
    print(f"# capacity model: {node_cores} cores per node, {pg_cores} cores for PostgreSQL, "
          f"{wal_mbps:g} MB/s of WAL; per node at most {node:,.0f} jobs/s "
          f"(cores / server CPU, or one core / the writer's or front end's CPU)")  # fmt: skip
    print("| nodes | nodes-bound jobs/s | PostgreSQL CPU-bound | WAL-bound | model | vs 1 node |")
    print("|---:|---:|---:|---:|---:|---:|")
    one = min(node, pg_bound, wal_bound)
    for n in (1, 2, 3, 4, 8, 16):
        model = min(n * node, pg_bound, wal_bound)
        print(f"| {n} | {n * node:,.0f} | {pg_bound:,.0f} | {wal_bound:,.0f} | {model:,.0f} | "
              f"{model / one:.2f}x |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,2,3")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--node-cores", type=int, default=8)
    parser.add_argument("--pg-cores", type=int, default=8)
    parser.add_argument("--wal-mbps", type=float, default=200.0)
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    keys = ("jobs_per_s", "server_us", "writer_us", "shard_us", "frontend_us", "pg_us", "wal_bytes")
    print("# push -> pull -> ack (PUSHB 100, PULLB 100 + ACKB), PostgreSQL synchronous_commit on;")
    print(f"# {args.seconds:g} s per run, medians of {args.repeats}; CPU µs and WAL bytes per job")
    print("| nodes | jobs/s (2 shared cores) | server CPU µs/job | writer | shards | front end "
          "| PostgreSQL CPU µs/job | WAL bytes/job |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    pg = PostgresServer().start()
    medians: dict[int, dict[str, float]] = {}
    try:
        for count in counts:
            runs = [run_once(pg, count, args.seconds, args.queues) for _ in range(args.repeats)]
            medians[count] = {k: statistics.median(r[k] for r in runs) for k in keys}
            cells = " | ".join(f"{medians[count][k]:,.1f}" for k in keys)
            print(f"| {count} | {cells} |", flush=True)
    finally:
        pg.stop()
    _model(medians, args.node_cores, args.pg_cores, args.wal_mbps)


if __name__ == "__main__":
    main()
