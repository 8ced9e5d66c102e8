"""What the cluster's fencing check costs one write batch on PostgreSQL (docs/cluster.md).

    python -m bench.cluster_fence [--batches 2000] [--repeats 5] [--partitions 1,16]

Each batch is one transaction, sent as a pipeline as `PostgresStore.apply` sends it: an
UPDATE of 100 job rows over arrays (the shape of a PULLB's moves), then the commit. The fenced
batch sends the fencing statement (`shardq.storage._pg_fence.FENCE_SQL`) first in the same
pipeline, and checks its rows before the commit as `PostgresStore.apply` does, for 1 (one
queue) or more partitions. Plain and fenced runs alternate, so that the server's state and
the machine's load weigh on both alike; the table gives medians per batch: wall time, this
process's CPU and the PostgreSQL server's CPU (all its processes, from /proc).

`--plans` times only the writer's own share (no server): finding a batch's partitions.

PostgreSQL is a throwaway cluster on this machine (`bench._pg_server`) with PostgreSQL's
default settings (fsync on, synchronous_commit on), over TCP on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg

from bench._pg_server import PostgresServer
from shardq.cluster._leases import acquire, ensure_partitions
from shardq.storage import open_postgres
from shardq.storage._pg_fence import FENCE_SQL, check

ROWS = 100
_UPDATE = (
    "UPDATE jobs AS j SET state = u.state, patch = j.patch || u.patch"
    " FROM unnest(%b::text[], %b::bytea[], %b::text[]) AS u(state, patch, id) WHERE j.id = u.id"
)


def _batches(
    conn: psycopg.Connection[Any], count: int, fence: tuple[object, ...] | None, states: list[str]
) -> None:
    ids = [f"j{i}" for i in range(ROWS)]
    patch = [b"\x00\x00\x00\x01\x80"] * ROWS
    for n in range(count):
        with conn.transaction():
            with conn.pipeline():
                if fence is not None:
                    rows = conn.cursor()
                    rows.execute(FENCE_SQL, fence)
                conn.cursor().execute(_UPDATE, ([states[n % 2]] * ROWS, patch, ids))
            if fence is not None:
                check("bench", fence[0], rows.fetchall())  # type: ignore[arg-type]


def _timed(run: Callable[[], None], server_cpu: Callable[[], float]) -> tuple[float, ...]:
    server, wall, cpu = server_cpu(), time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu, server_cpu() - server


def time_plans(repeat: int = 2000) -> None:
    """The writer's share: finding a batch's queues and partitions (`plan_queues` and
    `Fence.epochs_for`) for the plans of one round of `bench.storage_pg` (no server)."""
    from bench.storage_pg import rounds
    from shardq.storage._coalesce import coalesce
    from shardq.storage._pg_fence import Fence, plan_queues

    push, finish = rounds(2)[1]
    plans = {
        "PUSHB of 100 (100 puts)": coalesce(push, lambda ids: {}),
        "PULLB+ACKB of 100 (100 updated rows)": coalesce(
            finish, lambda ids: {i: ("q", 10, 0, 0) for i in ids}
        ),
    }
    held = dict.fromkeys(range(256), 1)
    fence = Fence("bench", 256, lambda: held)
    for name, plan in plans.items():
        started = time.perf_counter()
        for _ in range(repeat):
            fence.epochs_for(plan_queues(plan, {}, lambda ids: {}))
        print(f"{name}: {(time.perf_counter() - started) / repeat * 1e6:.1f} µs per batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--partitions", default="1,16", help="partitions a batch writes")
    parser.add_argument("--plans", action="store_true", help="time the writer's share only")
    args = parser.parse_args()
    if args.plans:
        time_plans()
        return
    server = PostgresServer().start()
    try:
        with open_postgres(server.url(), schema="fence") as store, store.new_connection() as conn:
            ensure_partitions(conn, 256)
            held = acquire(conn, "bench", {}, 256, 3_600_000)
            rows = [(f"j{i}", "q", "waiting", 1, b"\x80") for i in range(ROWS)]
            conn.cursor().executemany(
                "INSERT INTO jobs (id, queue, state, seq, rec) VALUES (%s, %s, %s, %s, %s)", rows
            )
            print(f"# {args.batches} batches of {ROWS} row updates, median of {args.repeats}")
            print("| batch | ms per batch | client CPU µs/batch | server CPU µs/batch |")
            print("|---|---:|---:|---:|")
            for count in (int(p) for p in args.partitions.split(",")):
                parts = list(range(count))
                fence = (parts, [held[p] for p in parts], "bench")
                plain: list[tuple[float, ...]] = []
                fenced: list[tuple[float, ...]] = []
                without = partial(_batches, conn, args.batches, None, ["a", "b"])
                with_fence = partial(_batches, conn, args.batches, fence, ["a", "b"])
                for _ in range(args.repeats):
                    plain.append(_timed(without, server.cpu_seconds))
                    fenced.append(_timed(with_fence, server.cpu_seconds))
                for name, runs in (("plain", plain), (f"fenced, {count} partition(s)", fenced)):
                    wall, cpu, srv = (statistics.median(r[k] for r in runs) for k in range(3))
                    per = 1e6 / args.batches
                    print(
                        f"| {name} | {wall * per / 1000:.3f} | {cpu * per:.0f} | {srv * per:.0f} |"
                    )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
