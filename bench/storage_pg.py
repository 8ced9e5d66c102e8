"""Storage apply throughput, SQLite against PostgreSQL, in one process.

    python -m bench.storage_pg [--rounds 300] [--repeats 3] [--url postgresql://...]

A round is the writer's two commits for 100 jobs: one `apply` of the 100 `put`s of a PUSHB
of 100, then one `apply` of the 100 moves of a PULLB of 100 and the 100 completions of its
ACKB. The mutations come from a real `Engine` and are encoded by `MutationEncoder`, as the
shards send them, before the clock starts; only `apply` is timed (wall clock, and this
process's CPU). Each backend starts empty:

- SQLite (WAL) with synchronous NORMAL (the server's default: no fsync per commit) and FULL;
- PostgreSQL with synchronous_commit on (its default: each commit waits for its WAL flush)
  and off (the WAL writer flushes within about 200 ms; a crash of the server, not only of
  the machine, can lose the last commits).

Without `--url`, PostgreSQL is a throwaway cluster on this machine (`bench._pg_server`), with
PostgreSQL's default settings (fsync on), over TCP on 127.0.0.1, and the server's CPU (all its
processes) is measured too. The client CPU column is this process's: for SQLite that is all
of the work, for PostgreSQL the client's share only. CPU time barely moves when other work
shares the machine; the wall-clock figures do.

`--fenced` times PostgreSQL without and with the cluster's fencing check (docs/cluster.md:
the store holds every partition, and each batch checks their epochs in its own transaction),
the runs alternating; `--queues N` spreads each round's jobs over N queues, so that a batch
checks N partitions; `--no-sqlite` leaves the SQLite rows out.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench._pg_server import PostgresServer
from shardq.core import Engine, Mutation
from shardq.storage import MutationEncoder, Storage, Store, open_postgres

T0 = 1_700_000_000_000
JOBS_PER_ROUND = 100


def rounds(count: int, queues: int = 1) -> list[tuple[list[Mutation], list[Mutation]]]:
    """(push batch, pull+ack batch) per round, encoded as a shard sends them. With `queues`
    > 1 a round's 100 jobs are spread over that many queues (one PUSHB, PULLB and ACKB
    each), so a batch writes that many queues: what a fence checks (`--fenced`)."""
    engine = Engine(seed=1)
    encode = MutationEncoder().encode
    out = []
    now = T0
    per = JOBS_PER_ROUND // queues
    for r in range(count):
        now += 1
        push: list[Mutation] = []
        finish: list[Mutation] = []
        for k in range(queues):
            queue = "q" if queues == 1 else f"q{k}"
            jobs = [{"data": {"i": r * JOBS_PER_ROUND + k * per + i}} for i in range(per)]
            push += engine.apply({"cmd": "PUSHB", "queue": queue, "jobs": jobs}, now).mutations
            pulled = engine.apply({"cmd": "PULLB", "queue": queue, "count": per, "owner": "b"}, now)
            ids = [job["id"] for job in pulled.reply["jobs"]]
            ack = {"cmd": "ACKB", "ids": ids, "tokens": pulled.reply["tokens"]}
            finish += list(pulled.mutations) + list(engine.apply(ack, now).mutations)
        out.append((encode(push), encode(finish)))
    return out


ServerCpu = Callable[[], float] | None


def run(
    store: Storage, batches: list[tuple[list[Mutation], list[Mutation]]], server_cpu: ServerCpu
) -> tuple[float, float, float]:
    """Apply every round's two batches; (wall seconds, CPU seconds of this process, and of
    the database server's processes: 0 when not measured)."""
    before = server_cpu() if server_cpu else 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    for push, finish in batches:
        store.apply(push)
        store.apply(finish)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, (server_cpu() - before) if server_cpu else 0.0


Opener = Callable[[int], contextlib.AbstractContextManager[Storage]]


def sqlite_opener(synchronous: str) -> Opener:
    @contextlib.contextmanager
    def opened(attempt: int) -> Iterator[Storage]:
        with (
            tempfile.TemporaryDirectory() as tmp,
            Store.open(Path(tmp) / "bench.db", synchronous=synchronous) as store,
        ):
            yield store

    return opened


def postgres_opener(url: str, synchronous_commit: str, fenced: bool = False) -> Opener:
    @contextlib.contextmanager
    def opened(attempt: int) -> Iterator[Storage]:
        sep = "&" if "?" in url else "?"
        setting = f"{url}{sep}options=-c%20synchronous_commit%3D{synchronous_commit}"
        schema = f"bench_{synchronous_commit}_{attempt}_{time.time_ns()}"
        with open_postgres(setting, schema=schema) as store:
            if fenced:
                _hold_every_partition(store)
            yield store

    return opened


def _hold_every_partition(store: Storage) -> None:
    """Make `store` a node holding all 256 partitions, so every batch runs the fencing check
    (docs/cluster.md) as a server on PostgreSQL does."""
    from shardq.cluster._leases import acquire, ensure_partitions
    from shardq.storage._pg_fence import Fence
    from shardq.storage._postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    with store.new_connection() as conn:
        ensure_partitions(conn, 256)
        held = acquire(conn, "bench", {}, 256, 3_600_000)
    store.fence = Fence("bench", 256, lambda: held)


Runs = tuple[list[float], list[float], list[float]]


def measure(
    name: str,
    opener: Opener,
    batches: list[tuple[list[Mutation], list[Mutation]]],
    repeats: int,
    server_cpu: ServerCpu = None,
) -> None:
    runs: Runs = ([], [], [])
    for attempt in range(repeats):
        _attempt(opener, attempt, batches, server_cpu, runs)
    report(name, batches, runs, server_cpu)


def _attempt(
    opener: Opener,
    attempt: int,
    batches: list[tuple[list[Mutation], list[Mutation]]],
    server_cpu: ServerCpu,
    runs: Runs,
) -> None:
    with opener(attempt) as store:
        for total, value in zip(runs, run(store, batches, server_cpu), strict=True):
            total.append(value)


def measure_fence(
    url: str,
    mode: str,
    batches: list[tuple[list[Mutation], list[Mutation]]],
    repeats: int,
    server_cpu: ServerCpu,
) -> None:
    """PostgreSQL without and with the fencing check, the runs alternating (plain, fenced,
    plain ...) so that the server's state (its caches, autovacuum, checkpoints) and the
    machine's load weigh on both alike."""
    plain, fenced = postgres_opener(url, mode), postgres_opener(url, mode, fenced=True)
    runs: tuple[Runs, Runs] = (([], [], []), ([], [], []))
    for attempt in range(repeats):
        _attempt(plain, attempt, batches, server_cpu, runs[0])
        _attempt(fenced, attempt, batches, server_cpu, runs[1])
    report(f"PostgreSQL, synchronous_commit {mode}", batches, runs[0], server_cpu)
    report(f"PostgreSQL, synchronous_commit {mode}, fenced", batches, runs[1], server_cpu)


def report(
    name: str,
    batches: list[tuple[list[Mutation], list[Mutation]]],
    runs: Runs,
    server_cpu: ServerCpu,
) -> None:
    walls, cpus, servers = runs
    jobs, commits = len(batches) * JOBS_PER_ROUND, len(batches) * 2
    wall = statistics.median(walls)
    cpu = statistics.median(cpus)
    server_us = f"{statistics.median(servers) / jobs * 1e6:.1f}" if server_cpu else "-"
    print(
        f"| {name} | {jobs / wall:,.0f} | {commits / wall:,.0f} | {wall / commits * 1e3:.2f} |"
        f" {cpu / jobs * 1e6:.1f} | {server_us} | {min(walls):.2f}-{max(walls):.2f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="rounds of 100 jobs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--url", help="an existing PostgreSQL database (default: a throwaway one)")
    parser.add_argument("--pg-modes", default="on,off", help="synchronous_commit values, in order")
    parser.add_argument("--queues", type=int, default=1, help="queues a round's jobs spread over")
    parser.add_argument(
        "--fenced",
        action="store_true",
        help="PostgreSQL without and with the cluster's fencing check, runs alternating",
    )
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SQLite rows")
    args = parser.parse_args()
    batches = rounds(args.rounds, args.queues)
    print(f"# {args.rounds} rounds of 100 jobs (2 commits each), median of {args.repeats}")
    print(
        "| backend | jobs/s | commits/s | ms per commit | client CPU µs/job"
        " | server CPU µs/job | wall s (min-max) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    if not args.no_sqlite:
        measure("SQLite, synchronous NORMAL", sqlite_opener("normal"), batches, args.repeats)
        measure("SQLite, synchronous FULL", sqlite_opener("full"), batches, args.repeats)
    with contextlib.ExitStack() as stack:
        url, server_cpu = args.url, None
        if url is None:
            server = PostgresServer().start()
            stack.callback(server.stop)
            url, server_cpu = server.url(), server.cpu_seconds
        for mode in args.pg_modes.split(","):
            if args.fenced:
                measure_fence(url, mode, batches, args.repeats, server_cpu)
                continue
            opener = postgres_opener(url, mode)
            name = f"PostgreSQL, synchronous_commit {mode}"
            measure(name, opener, batches, args.repeats, server_cpu)


if __name__ == "__main__":
    main()
