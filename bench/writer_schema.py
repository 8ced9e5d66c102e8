"""The SQLite statements of a recorded writer stream on a variant of the schema or of the
statements' form, to price a change to the `jobs` table before building it.

    python -m bench.writer_schema OUT [--variant rowid|norowid|manyupd|manyins] [--times 1]

OUT is a recording of `python -m bench.writer_split record` (ppa1q's statements). Each run
makes a fresh database of the newest schema and replays the statements `--times` times over,
printing the CPU µs a job of each and the database's pages. For valgrind: the instructions of
one replay are those of `--times 2` less those of `--times 1`.

- `rowid`: the schema as it is (what `writer_split replay` does).
- `norowid`: `jobs` rebuilt WITHOUT ROWID, keyed by `id` (its primary key's index gone; every
  other index rebuilt as it was, its entries then holding the id instead of a rowid).
- `manyupd`: each `UPDATE ... WHERE id IN (...)` run as `executemany` of one id each.
- `manyins`: each multi-row `INSERT INTO jobs ... VALUES (...), (...)` as `executemany` of one.
"""

from __future__ import annotations

import argparse
import logging
import pickle
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

from bench.writer_split import Statement
from shardq.storage import Store
from shardq.storage._schema import configure

VARIANTS = ("rowid", "norowid", "manyupd", "manyins")


def _without_rowid(conn: sqlite3.Connection) -> None:
    """Rebuild the (empty) `jobs` table WITHOUT ROWID, with its indexes and triggers."""
    objects = conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE tbl_name = 'jobs' AND sql IS NOT NULL"
    ).fetchall()
    (table,) = [sql for kind, _name, sql in objects if kind == "table"]
    conn.execute("DROP TABLE jobs")  # its indexes and triggers go with it
    conn.execute(f"{table} WITHOUT ROWID")
    for kind, _name, sql in objects:
        if kind != "table":
            conn.execute(sql)


def fresh(path: Path, variant: str) -> sqlite3.Connection:
    """A new database of the newest schema (`variant`'s), configured as the writer's."""
    Store.open(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    if variant == "norowid":
        _without_rowid(conn)
    configure(conn, synchronous="normal", max_bytes=None)
    return conn


def _one_update_each(sql: str, params: list[Any]) -> Statement:
    head = sql.split(" WHERE id IN (")[0]
    fixed = head.count("?")
    keys = dict.fromkeys(params[fixed:])  # `_rows.run_keys` pads a list with its last key
    return f"{head} WHERE id = ?", [(*params[:fixed], key) for key in keys], True


def _one_insert_each(sql: str, params: list[Any]) -> Statement:
    head, rest = sql.split(" VALUES ", 1)
    one = rest.split("), ")[0] + ")"
    tail = rest[rest.index(" ON CONFLICT") :] if " ON CONFLICT" in rest else ""
    width = one.count("?")
    rows = [tuple(params[i : i + width]) for i in range(0, len(params), width)]
    return f"{head} VALUES {one}{tail}", rows, True


def statements(log: list[Statement], variant: str) -> list[Statement]:
    """The recorded statements in `variant`'s form (the same rows written)."""
    out: list[Statement] = []
    for sql, params, many in log:
        shared_update = sql.startswith("UPDATE jobs SET") and " WHERE id IN (" in sql
        if variant == "manyupd" and not many and shared_update:
            out.append(_one_update_each(sql, params))
        elif variant == "manyins" and not many and sql.startswith("INSERT INTO jobs "):
            out.append(_one_insert_each(sql, params))
        else:
            out.append((sql, params, many))
    return out


def replay(log: list[Statement], variant: str) -> tuple[float, int, list[Any]]:
    """CPU seconds of the statements on a fresh database, its pages and its jobs' rows."""
    with tempfile.TemporaryDirectory() as tmp:
        conn = fresh(Path(tmp) / "replay.db", variant)
        start = time.process_time()
        for sql, params, many in log:
            if many:
                conn.executemany(sql, params)
            else:
                conn.execute(sql, params)
        spent = time.process_time() - start
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        rows = conn.execute(
            "SELECT id, queue, state, priority, run_at, seq, rec, patch FROM jobs ORDER BY id"
        ).fetchall()
        conn.close()
    return spent, int(pages), rows


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--variant", choices=VARIANTS, default="rowid")
    parser.add_argument("--times", type=int, default=1)
    args = parser.parse_args()
    data = pickle.loads(args.out.read_bytes())
    log = statements(data["log"], args.variant)
    spent: list[str] = []
    pages, rows = 0, 0
    for _ in range(args.times):
        seconds, pages, stored = replay(log, args.variant)
        rows = len(stored)
        spent.append(f"{seconds / data['jobs'] * 1e6:.2f}")
    print(f"{args.variant}: statements µs/job {', '.join(spent)}; pages {pages}; rows {rows}")


if __name__ == "__main__":
    main()
