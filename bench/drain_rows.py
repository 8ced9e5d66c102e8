"""A Drain's range deletion in the storage alone: N cold rows, one `qdrain` (issue 22).

    python -m bench.drain_rows [--rows 1000000] [--chunks 50000,1000000] [--pg URL]
                               [--without-count-triggers]

Writes N cold waiting and delayed rows of one queue (encoded puts as a shard sends them, in
batches of 10,000, plus 1,000 rows of another queue that must stay), then applies one
`("qdrain", queue, N)` per chunk size (`Store.drain_chunk`, each on a fresh store) and
prints its wall time, this process's CPU time (SQLite runs in it; PostgreSQL's work is the
server's, so only wall time means something there) and the database size before and after.
The rows are fresh in the page cache, as a backlog the writer just wrote is; a backlog
written long ago is read from disk first. Record `uptime`'s load beside the numbers.
`--without-count-triggers` (SQLite) drops the `cold_counts` triggers before the drain, to
show their share of its cost (the counts are then wrong: a measurement, not a mode).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from shardq.core._mutations import Mutation
from shardq.storage import MutationEncoder, Storage, open_postgres
from shardq.storage._store import Store

QUEUE, OTHER = "drained", "kept"
BATCH = 10_000
T0 = 1_700_000_000_000


def _record(i: int, queue: str) -> dict[str, Any]:
    delayed = i % 5 == 0
    return {
        "id": f"{queue}-{i}", "queue": queue, "state": "delayed" if delayed else "waiting",
        "seq": i, "priority": i % 3, "runAt": T0 + (60_000 if delayed else 0), "attempts": 0,
        "data": {"i": i}, "createdAt": T0 + i, "cold": 1, "logs": None, "logsAdded": 0,
    }  # fmt: skip


def _fill(store: Storage, rows: int) -> None:
    encode = MutationEncoder().encode
    for start in range(0, rows, BATCH):
        batch: list[Mutation] = [
            ("put", _record(i, QUEUE)) for i in range(start, min(rows, start + BATCH))
        ]
        store.apply(encode(batch))
    store.apply(encode([("put", _record(i, OTHER)) for i in range(1000)]))


def _one(store: Storage, rows: int, chunk: int, triggers: bool) -> dict[str, float]:
    _fill(store, rows)
    if not triggers:
        for name in ("cold_counts_delete", "cold_counts_update", "cold_counts_insert"):
            store._conn.execute(f"DROP TRIGGER {name}")  # type: ignore[attr-defined]
    before = store.database_bytes()
    store.drain_chunk = chunk  # type: ignore[attr-defined]
    wall, cpu = time.perf_counter(), time.process_time()
    written = store.apply([("qdrain", QUEUE, rows)])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    counts = store.cold_counts(QUEUE), store.cold_counts(OTHER)
    if triggers:
        assert written >= rows and counts[0].waiting + counts[0].delayed == 0, (written, counts)
        assert counts[1].waiting + counts[1].delayed == 1000, counts
    return {"wall_s": wall, "cpu_s": cpu, "mb_before": before / 1e6,
            "mb_after": store.database_bytes() / 1e6}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunks", default="50000,1000000")
    parser.add_argument("--pg", default=None, help="a PostgreSQL URL (else SQLite)")
    parser.add_argument("--without-count-triggers", action="store_true")
    args = parser.parse_args()
    for chunk in (int(c) for c in args.chunks.split(",")):
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="drain-rows-") as place:
            if args.pg:
                schema = f"drain_rows_{os.getpid()}_{chunk}"
                store: Storage = open_postgres(args.pg, schema=schema)
            else:
                store = Store.open(Path(place) / "shardq.db")
            with store:
                result = _one(store, args.rows, chunk, not args.without_count_triggers)
        print(
            f"{'postgres' if args.pg else 'sqlite'}: {args.rows:,} rows, chunk {chunk:,},"
            f"{' no count triggers,' if args.without_count_triggers else ''}"
            f" load {load:.1f}: {result['wall_s']:.2f} s wall, {result['cpu_s']:.2f} s CPU"
            f" (this process), {result['mb_before']:.0f} MB -> {result['mb_after']:.0f} MB",
            flush=True,
        )


if __name__ == "__main__":
    main()
