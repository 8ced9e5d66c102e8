"""What a set of indexes costs the life of a hot job row in SQLite alone, to pick a design.

    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=OUT \\
        python -m bench.coldindexes VARIANT ROWS [--many]

Each row is put (`waiting`), updated twice (`active`, `completed`, a patch appended each
time) and deleted, in transactions of 500, as the writer writes a job's life: with
`executemany` (a statement run per row), or with `--many` in statements of 100 rows (as
`shardq.storage._rows`). Count at 2N and N rows; the difference over N is the cost per row.

Variants (the `jobs` table and its `queue` and `seq` indexes, then):

- `A`: nothing more (the schema before the cold backlog);
- `B`: the four cold columns and the four partial cold indexes (`_schema._v9_cold_backlog`);
- `D`: the cold columns, and a side table of the cold rows kept by triggers on `jobs`;
- `E`: `B` with the seq index split in two partial ones (the hot set, and the cold waiting
  and delayed rows), so that a budgeted start could read the hot set alone.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

_COLD_INDEXES = (
    "CREATE INDEX w ON jobs (queue, (-coalesce(priority, 0)), (-lifo),"
    " (CASE WHEN lifo = 1 THEN -seq ELSE coalesce(run_at, 0) END), seq, id, cold, state, gid)"
    " WHERE cold = 1 AND state = 'waiting' AND gid IS NULL",
    "CREATE INDEX g ON jobs (queue, gid, (coalesce(priority, 0)), (coalesce(run_at, 0)), seq,"
    " id, cold, state) WHERE cold = 1 AND state = 'waiting' AND gid IS NOT NULL",
    "CREATE INDEX dl ON jobs (queue, (coalesce(run_at, 0)), seq, id, gid, cold, state)"
    " WHERE cold = 1 AND state = 'delayed'",
    "CREATE INDEX u ON jobs (queue, ukey, seq) WHERE cold = 1 AND ukey IS NOT NULL",
)
_SPLIT_SEQ = (
    "DROP INDEX idx_jobs_seq",
    "CREATE INDEX idx_jobs_seq ON jobs (seq) WHERE cold IS NULL"
    " OR state NOT IN ('waiting', 'delayed')",
    "CREATE INDEX idx_jobs_cold_seq ON jobs (seq) WHERE cold = 1"
    " AND state IN ('waiting', 'delayed')",
)
_SIDE_TABLE = (
    "CREATE TABLE cold_jobs (id TEXT PRIMARY KEY, queue TEXT NOT NULL, state TEXT NOT NULL,"
    " priority REAL, run_at INTEGER, seq INTEGER NOT NULL, lifo INTEGER, gid TEXT, ukey TEXT)",
    "CREATE INDEX w ON cold_jobs (queue, (-coalesce(priority, 0)), (-lifo), seq, id)"
    " WHERE state = 'waiting' AND gid IS NULL",
    "CREATE TRIGGER cold_upd AFTER UPDATE OF state, priority, run_at ON jobs"
    " WHEN old.cold = 1 BEGIN UPDATE cold_jobs SET state = new.state,"
    " priority = new.priority, run_at = new.run_at WHERE id = new.id; END",
    "CREATE TRIGGER cold_del AFTER DELETE ON jobs WHEN old.cold = 1"
    " BEGIN DELETE FROM cold_jobs WHERE id = old.id; END",
)
_BATCH, _MANY = 500, 100
_COLUMNS = "id, queue, state, priority, run_at, seq, rec, patch"
_UPSERT_TAIL = " ON CONFLICT (id) DO UPDATE SET state = excluded.state"


def _schema(conn: sqlite3.Connection, variant: str) -> None:
    conn.execute(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, queue TEXT NOT NULL, state TEXT NOT NULL,"
        " priority REAL, run_at INTEGER, seq INTEGER NOT NULL, rec BLOB NOT NULL,"
        " patch BLOB NOT NULL)"
    )
    conn.execute("CREATE INDEX idx_jobs_queue ON jobs (queue)")
    conn.execute("CREATE INDEX idx_jobs_seq ON jobs (seq)")
    if variant == "A":
        return
    for column in ("cold INTEGER", "lifo INTEGER", "gid TEXT", "ukey TEXT"):
        conn.execute(f"ALTER TABLE jobs ADD COLUMN {column}")
    extra = {"B": _COLD_INDEXES, "D": _SIDE_TABLE, "E": _COLD_INDEXES + _SPLIT_SEQ}[variant]
    for sql in extra:
        conn.execute(sql)


def _marks(count: int, width: int) -> str:
    return ", ".join([f"({', '.join('?' * width)})"] * count)


def _run(conn: sqlite3.Connection, head: str, tail: str, rows: list[tuple[Any, ...]]) -> None:
    """`head VALUES rows tail` over `rows`, `_MANY` rows a statement."""
    for start in range(0, len(rows), _MANY):
        part = rows[start : start + _MANY]
        sql = f"{head}{_marks(len(part), len(part[0]))}{tail}"
        conn.execute(sql, [value for row in part for value in row])


def _lives(conn: sqlite3.Connection, rows: int, many: bool) -> None:
    rec = b"\x80" * 300
    for first in range(0, rows, _BATCH):
        put = [(f"j{i}", "q", "waiting", 0, 1, i, rec, b"") for i in range(first, first + _BATCH)]
        with conn:
            if many:
                _run(conn, f"INSERT INTO jobs ({_COLUMNS}) VALUES ", _UPSERT_TAIL, put)
            else:
                sql = f"INSERT INTO jobs ({_COLUMNS}) VALUES ({', '.join('?' * 8)}){_UPSERT_TAIL}"
                conn.executemany(sql, put)
    for state in ("active", "completed"):
        for first in range(0, rows, _BATCH):
            upd = [(state, b"\x81\xa1s\xa1a", f"j{i}") for i in range(first, first + _BATCH)]
            with conn:
                if many:
                    head = "UPDATE jobs SET state = v.column1,"
                    head += " patch = CAST(patch || v.column2 AS BLOB) FROM (VALUES "
                    _run(conn, head, ") AS v WHERE jobs.id = v.column3", upd)
                else:
                    sql = "UPDATE jobs SET state = ?, patch = CAST(patch || ? AS BLOB) WHERE id = ?"
                    conn.executemany(sql, upd)
    for first in range(0, rows, _BATCH):
        ids = [(f"j{i}",) for i in range(first, first + _BATCH)]
        with conn:
            if many:
                _run(conn, "DELETE FROM jobs WHERE id IN (", ")", ids)
            else:
                conn.executemany("DELETE FROM jobs WHERE id = ?", ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=("A", "B", "D", "E"))
    parser.add_argument("rows", type=int)
    parser.add_argument("--many", action="store_true")
    args = parser.parse_args(argv)
    if args.rows < _BATCH or args.rows % _BATCH:
        parser.error(f"rows must be a positive multiple of {_BATCH}")
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "x.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        _schema(conn, args.variant)
        conn.isolation_level = "DEFERRED"  # `with conn` commits each batch
        _lives(conn, args.rows, args.many)
        left = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        conn.close()
    if left:
        raise SystemExit(f"{left} rows left: the run did not delete every row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
