"""The cold backlog's reads at scale: page-ins, lookups and counts over a large store.

    python -m bench.coldstore [--jobs 1000000] [--page 1000] [--repeat 5] [--postgres]
                              [--dir DIR] [--json PATH]

Fills a store (SQLite in a temporary directory; with `--postgres`, a throwaway PostgreSQL
server as bench.storage_pg starts one) with `--jobs` waiting jobs of one queue, as the writer
stores them (encoded puts in batches of 1,000): 10% LIFO, 10% in 100 groups, 10% delayed, 5%
with a custom id, 5% with a uniqueKey, priorities 0-3. A first store is filled with them hot
(as every job is stored before the cold columns) at the schema version before those columns,
its size taken, then opened by this code, which migrates it (nothing to fill: it builds the
indexes, timed) and its size taken again. A second store is filled at the latest version with
the same jobs marked cold, as a budgeted engine stores a backlog it does not keep
(`shardq.storage._cold`). On it, each `--repeat` times (the median is printed):

- a page-in of `--page` at the head of the waiting order, in its middle and at its end, at
  the head of one group, and of the delayed jobs;
- `get_job`, `get_by_custom_id`, `find_unique` of a job in the middle;
- `cold_counts` of the queue;
- `load_jobs(hot_only=True)`, what a budgeted shard's start reads: it walks the cold rows
  and decodes none of them.

The two fills time the hot puts at the old version against the cold puts at the latest, and
the state change of `--page` jobs (a pull's `upd`) on both.
Progress goes to stderr, the results as a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from shardq.storage import MutationEncoder, Storage, Store, _schema
from shardq.storage._cold_reads import MAX_LIMIT, waiting_cursor

QUEUE = "cold"
T0 = 1_700_000_000_000
BATCH = 1000


def record(n: int, cold: bool = False) -> dict[str, Any]:
    """Job `n` of the fill, as the engine records a small job (`cold`: marked cold)."""
    rec: dict[str, Any] = {
        "id": f"job-{n:08d}", "queue": QUEUE, "name": "default", "data": {"i": n},
        "priority": n % 4, "createdAt": T0, "runAt": T0 + n // 1000, "startedAt": None,
        "completedAt": None, "attempts": 0, "maxAttempts": 3, "progress": 0,
        "progressMessage": None, "stacktrace": None, "lastHeartbeat": T0, "stallCount": 0,
        "childrenCompleted": 0, "lifo": n % 10 == 3, "timeline": [["waiting", T0, None]],
        "state": "waiting", "seq": n + 1, "failedReason": None, "dlq": None, "dlqRetries": 0,
        "logs": None, "logsAdded": 0, "dedupUntil": None, "hasResult": False,
    }  # fmt: skip
    if n % 10 == 5:
        rec["groupId"] = f"g{n % 100}"
    if n % 10 == 7:
        rec["state"], rec["runAt"] = "delayed", T0 + 3_600_000 + n
    if n % 20 == 1:
        rec["customId"] = rec["id"] = f"c{n}"
        rec["rowKey"] = f"c{n}\x1f{QUEUE}"
    if n % 20 == 2:
        rec["uniqueKey"] = f"u{n}"
    if cold:
        rec["cold"] = 1
    return rec


def fill(store: Storage, jobs: int, cold: bool) -> float:
    """Put `jobs` jobs; return seconds."""
    encode = MutationEncoder().encode
    start = time.perf_counter()
    for first in range(0, jobs, BATCH):
        batch = [("put", record(n, cold)) for n in range(first, min(jobs, first + BATCH))]
        store.apply(encode(batch))
        if first % 200_000 == 0:
            _note(f"filled {first:,}")
    return time.perf_counter() - start


def pull_updates(store: Storage, jobs: int, count: int) -> float:
    """The state change a PULLB of `count` makes (waiting -> active) on plain jobs in the
    middle; return seconds."""
    ids = [record(n)["id"] for n in range(jobs // 2, jobs) if n % 10 in (0, 4, 6)][:count]
    change = {"state": "active", "startedAt": T0 + 1, "attempts": 1}
    encode = MutationEncoder().encode
    start = time.perf_counter()
    store.apply(encode([("upd", job_id, change) for job_id in ids]))
    return time.perf_counter() - start


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def measure_reads(store: Storage, jobs: int, page: int, repeat: int) -> dict[str, float]:
    middle = _nth_waiting(store, jobs // 2 // page * page)
    counts = store.cold_counts(QUEUE)
    ungrouped = counts.waiting - sum(counts.group_waiting.values())
    end = _nth_waiting(store, max(0, ungrouped - page - 1))
    probe = record(jobs // 2 // 20 * 20 + 1)  # a custom-id job in the middle
    unique = record(jobs // 2 // 20 * 20 + 2)
    out = {
        "page_head_ms": median_ms(lambda: store.page_waiting(QUEUE, limit=page), repeat),
        "page_middle_ms": median_ms(
            lambda: store.page_waiting(QUEUE, waiting_cursor(middle), limit=page), repeat
        ),
        "page_end_ms": median_ms(
            lambda: store.page_waiting(QUEUE, waiting_cursor(end), limit=page), repeat
        ),
        "page_group_ms": median_ms(lambda: store.page_group(QUEUE, "g5", limit=page), repeat),
        "page_delayed_ms": median_ms(lambda: store.page_delayed(QUEUE, limit=page), repeat),
        "get_job_ms": median_ms(lambda: store.get_job(probe["rowKey"]), repeat),
        "get_by_custom_id_ms": median_ms(
            lambda: store.get_by_custom_id(QUEUE, probe["customId"]), repeat
        ),
        "find_unique_ms": median_ms(lambda: store.find_unique(QUEUE, unique["uniqueKey"]), repeat),
        "cold_counts_ms": median_ms(lambda: store.cold_counts(QUEUE), max(1, repeat // 2)),
        "load_hot_only_ms": median_ms(
            lambda: sum(1 for _ in store.load_jobs(hot_only=True)), max(1, repeat // 2)
        ),
    }
    # The pull_updates jobs are active, the rest cold waiting or delayed.
    assert 0 < sum(1 for _ in store.load_jobs(hot_only=True)) <= page
    for cursor in (middle, end):
        assert len(store.page_waiting(QUEUE, waiting_cursor(cursor), limit=page).records) == page
    assert store.get_by_custom_id(QUEUE, probe["customId"]) is not None
    assert len(store.find_unique(QUEUE, unique["uniqueKey"])) == 1
    return out


def _nth_waiting(store: Storage, n: int) -> dict[str, Any]:
    """The `n`th ungrouped waiting job in delivery order, paged to."""
    after = None
    left = n
    while True:
        page = store.page_waiting(QUEUE, after, limit=min(MAX_LIMIT, left + 1))
        if left < len(page.records):
            return page.records[left]
        left -= len(page.records)
        after = page.after


@contextmanager
def sqlite_places(base: Path) -> Iterator[tuple[Callable[[str, int | None], Storage], Any]]:
    def open_at(name: str, version: int | None) -> Storage:
        path = base / f"{name}.db"
        if version is None:
            return Store.open(path)
        with mock.patch.object(_schema, "MIGRATIONS", _schema.MIGRATIONS[:version]):
            return Store.open(path)

    def size_mb(name: str) -> float:
        files = [base / f"{name}.db{suffix}" for suffix in ("", "-wal")]
        return round(sum(f.stat().st_size for f in files if f.exists()) / 1e6, 1)

    yield open_at, size_mb


@contextmanager
def postgres_places(base: Path) -> Iterator[tuple[Callable[[str, int | None], Storage], Any]]:
    from bench._pg_server import PostgresServer
    from shardq.storage import _pg_schema, open_postgres

    server = PostgresServer().start()
    try:

        def open_at(name: str, version: int | None) -> Storage:
            url = server.url()
            if version is None:
                return open_postgres(url, schema=name)
            with mock.patch.object(_pg_schema, "MIGRATIONS", _pg_schema.MIGRATIONS[:version]):
                return open_postgres(url, schema=name)

        def size_mb(name: str) -> float:
            import psycopg

            with psycopg.connect(server.url(), autocommit=True) as conn:
                sql = (
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = %s AND c.relkind = 'r'"
                )
                row = conn.execute(sql, (name,)).fetchone()
                return round(int(row[0] if row else 0) / 1e6, 1)

        yield open_at, size_mb
    finally:
        server.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="shardq-coldstore-", dir=args.dir))
    places = postgres_places if args.postgres else sqlite_places
    if args.postgres:
        from shardq.storage import _pg_schema

        before = _pg_schema.COLD_VERSION - 1
    else:
        before = _schema.COLD_VERSION - 1
    row: dict[str, Any] = {"backend": "postgres" if args.postgres else "sqlite", "jobs": args.jobs}
    try:
        with places(base) as (open_at, size_mb):
            _note(f"filling {args.jobs:,} jobs at schema version {before}")
            with open_at("old", before) as store:
                row["fill_old_s"] = round(fill(store, args.jobs, cold=False), 1)
                row["pull_upd_old_ms"] = round(pull_updates(store, args.jobs, args.page) * 1e3, 1)
                store.checkpoint()
            row["size_before_mb"] = size_mb("old")
            start = time.perf_counter()
            with open_at("old", None) as store:
                row["migrate_s"] = round(time.perf_counter() - start, 1)
                store.checkpoint()
            row["size_after_mb"] = size_mb("old")
            _note("filling again at the latest schema, every job cold")
            with open_at("new", None) as store:
                row["fill_new_cold_s"] = round(fill(store, args.jobs, cold=True), 1)
                row["pull_upd_new_ms"] = round(pull_updates(store, args.jobs, args.page) * 1e3, 1)
                store.checkpoint()
            row["size_new_mb"] = size_mb("new")
            _note("reading")
            with open_at("new", None) as store:
                row.update(measure_reads(store, args.jobs, args.page, args.repeat))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return row


def _note(text: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--page", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--dir", help="where the store goes (default: the temp dir)")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    if args.jobs < 100 or not 1 <= args.page <= MAX_LIMIT or args.repeat < 1:
        parser.error("--jobs must be at least 100, --page from 1 to 100000, --repeat >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"# python {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    row = run(args)
    row["load_after"] = os.getloadavg()
    for key, value in row.items():
        print(f"| {key} | {value} |")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(row, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
