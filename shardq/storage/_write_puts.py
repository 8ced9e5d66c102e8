"""Writing the rows put in a batch, and deleting the ones it deleted (inside a transaction).

A put replaces a job's whole row: its columns, `rec`, `patch` and its cold columns (a hot
record's NULL, `_cold`). The plan's put rows (`_write.whole_row`, or the usual put's tuple
`_write._write_jobs` builds inline) are upserted here, many rows a statement (`_rows`), in the
plan's order, which gives new rows their rowids (and so the tie order among equal seqs). The
statements' text lives here; `_lone` formats the hot upsert for one row.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Final

from shardq.storage._deltas import delete_deltas
from shardq.storage._encode import COLUMN_FIELDS
from shardq.storage._rows import run_keys, run_rows
from shardq.storage._write_updates import BLOB

__all__ = [
    "COLD_COLUMNS",
    "FRESH_ROW",
    "HOT_ROW",
    "write_replaced",
]

# The statements over the rows put in a batch (`_rows.run_rows` fills in `{rows}`).
_UPSERT_SET = (
    " ON CONFLICT (id) DO UPDATE SET queue = excluded.queue, state = excluded.state,"
    " priority = excluded.priority, run_at = excluded.run_at, seq = excluded.seq,"
    " rec = excluded.rec, patch = excluded.patch"
)
_UPSERT_JOB = (
    "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec, patch) VALUES {rows}"
    # An in-place update, unlike INSERT OR REPLACE, rewrites only the indexes whose columns
    # changed, and keeps the rowid (and so the tie order among equal seqs) stable. A put
    # replaces the whole row: one of a hot record leaves the cold columns NULL (`_cold`).
    f"{_UPSERT_SET}, cold = NULL, lifo = NULL, gid = NULL, ukey = NULL"
)
# A cold record's put: the same with its cold columns.
_UPSERT_COLD_JOB = (
    "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec, patch, cold, lifo, gid,"
    f" ukey, made) VALUES {{rows}}{_UPSERT_SET}, cold = excluded.cold, lifo = excluded.lifo,"
    " gid = excluded.gid, ukey = excluded.ukey, made = excluded.made"
)
# The same at a schema with the cold columns but not yet `made` (versions 9 and 10).
_UPSERT_COLD_JOB_V9 = (
    "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec, patch, cold, lifo, gid,"
    f" ukey) VALUES {{rows}}{_UPSERT_SET}, cold = excluded.cold, lifo = excluded.lifo,"
    " gid = excluded.gid, ukey = excluded.ukey"
)
# A store at a schema older than the cold columns (tests build one) writes rows without them.
_UPSERT_PLAIN_JOB = (
    "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec, patch) VALUES {rows}"
    + _UPSERT_SET
)
_MARK_COLD = "UPDATE jobs SET cold = 1 WHERE id IN ({rows})"

COLD_COLUMNS: Final = 5
"""The cold columns of the newest schema (`_cold`): `cold`, `lifo`, `gid`, `ukey`, `made`."""
_COLUMNS = len(COLUMN_FIELDS)
# The length of a hot row's tuple from `whole_row` (id, column fields, rec, patch).
HOT_ROW = 3 + len(COLUMN_FIELDS)
# The usual put's row (`_write_jobs`): `patch` left to its default, the empty blob, which
# `excluded.patch` is too. One bound parameter a put fewer; the row stored is the same.
_UPSERT_FRESH_JOB = (
    "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec) VALUES {rows}"
    f"{_UPSERT_SET}, cold = NULL, lifo = NULL, gid = NULL, ukey = NULL"
)
# The length of a row tuple of the usual put (`_write_jobs`): a hot row without its patch.
FRESH_ROW = HOT_ROW - 1
_DELETE_JOBS = "DELETE FROM jobs WHERE id IN ({rows})"
# The empty patch of every put row written without one: one object for them all (sqlite3
# only reads a parameter, nothing else holds the row tuples).
_NO_PATCH: Final = BLOB()


def write_replaced(
    conn: sqlite3.Connection,
    deleted: list[tuple[str]],
    put: tuple[list[tuple[Any, ...]], int],
    cold_rows: list[tuple[Any, ...]],
    deltas_exist: bool,
    cold: int,
) -> tuple[int, int]:
    """Delete the `deleted` rows and write the whole ones (`_write_whole`; `put`: the hot
    ones and how many of them go without their patch), and delete the ops of both; (rows
    written, change in `job_deltas` rows)."""
    written = delta_rows = 0
    whole, fresh = put
    if fresh and fresh < len(whole):
        # In the plan's order, which gives new rows their rowids: one statement for all.
        whole = [one if len(one) == HOT_ROW else (*one, _NO_PATCH) for one in whole]
    if deltas_exist:
        # A put replaces the whole record, ops included (a batch resent to a new writer).
        gone = [k for (k,) in deleted] + [w[0] for w in whole] + [w[0] for w in cold_rows]
        delta_rows -= delete_deltas(conn, gone)
    if deleted:
        written += run_rows(conn, _DELETE_JOBS, 1, deleted)
    if whole or cold_rows:
        written += _write_whole(conn, whole, cold_rows, cold)
    return written, delta_rows


def _write_whole(
    conn: sqlite3.Connection,
    whole: list[tuple[Any, ...]],
    cold_rows: list[tuple[Any, ...]],
    cold: int,
) -> int:
    """Upsert the rows put in the batch: hot ones and cold ones (`whole_row`). `cold`: the
    cold columns the table has (`write_plan`; the cold rows are written with those only)."""
    written = 0
    if whole and len(whole[0]) == FRESH_ROW:  # all of them are (`write_replaced`)
        if not cold:
            whole = [(*one, _NO_PATCH) for one in whole]
        else:
            written += run_rows(conn, _UPSERT_FRESH_JOB, FRESH_ROW, whole)
            whole = []
    if not cold:
        rows = whole + [one[:HOT_ROW] for one in cold_rows]
        return run_rows(conn, _UPSERT_PLAIN_JOB, HOT_ROW, rows)
    if whole:
        written += run_rows(conn, _UPSERT_JOB, HOT_ROW, whole)
    if cold_rows and cold < COLD_COLUMNS:
        rows = [one[: HOT_ROW + cold] for one in cold_rows]
        written += run_rows(conn, _UPSERT_COLD_JOB_V9, HOT_ROW + cold, rows)
    elif cold_rows:
        # Put with `cold` NULL, then marked: no insert trigger counts (from schema 14 there is
        # none, so that a hot put runs none), the mark's UPDATE OF cold does. A put over a
        # stored cold row sets `cold` too, and the trigger takes that row's count off.
        rows = [(*one[:HOT_ROW], None, *one[HOT_ROW + 1 :]) for one in cold_rows]
        written += run_rows(conn, _UPSERT_COLD_JOB, HOT_ROW + COLD_COLUMNS, rows)
        run_keys(conn, _MARK_COLD, 0, (), [one[0] for one in cold_rows])
    return written
