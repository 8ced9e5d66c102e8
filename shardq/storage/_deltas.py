"""The `job_deltas` table: a job's `delta` ops (shardq.core._mutations), one row each.

Why a table of their own. SQLite rewrites a whole row, with every overflow page of its blobs,
whenever any column of it changes. A parent with 10,000 children holds their values in its
record, so appending each child's value to the row's `patch` rewrote a row of megabytes per
flush: the 10,000-child fan-in grew the database plus WAL by hundreds of MB. An op appended as
a row of its own writes its own bytes and the index entry, whatever the job holds.

A stored job is therefore `rec`, then its `patch` merged in, then its delta rows applied in
rowid order. Ops touch only the parts of a record that no `upd` changes after its `put` (the
log, the flow maps), so applying them after the whole patch gives the state the mutations'
order gives. Once a job's ops outgrow its record (and `patch_floor`) they are folded: record,
patch and ops merged into a new `rec`, with the patch emptied and the ops deleted. Folding
costs a decode and an encode of the record after at least a record's length of ops was
appended, so the bytes written per op stay bounded by a constant factor.

A job put in the same batch as its ops takes them into its patch instead (its whole row is
written anyway), wrapped as a one-entry map under `DELTA_KEY`, a key no record field has.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core._mutations import Record, apply_delta, finish_deltas

__all__ = [
    "DELTA_KEY",
    "delete_deltas",
    "delete_queue_deltas",
    "delta_lengths",
    "insert_deltas",
    "read_deltas",
    "wrap",
]

DELTA_KEY: Final = "\x00delta"
"""The key of a patch entry that holds a delta op rather than changed fields."""
_WRAP_HEAD: Final[bytes] = b"\x81" + msgpack.packb(DELTA_KEY, use_bin_type=True)  # a 1-entry map
# SQLite's historical bound on parameters per statement.
_CHUNK: Final = 500

Part = bytes | Record


def wrap(op: Part) -> Part:
    """`op` as a patch entry: a map of one entry `DELTA_KEY: op` (bytes stay bytes)."""
    if type(op) is bytes:
        return _WRAP_HEAD + op
    return {DELTA_KEY: op}


def insert_deltas(conn: sqlite3.Connection, rows: list[tuple[str, bytes]]) -> None:
    """Append ops: (job row key, encoded op) pairs, in order."""
    conn.executemany("INSERT INTO job_deltas (id, d) VALUES (?, ?)", rows)


def delete_deltas(conn: sqlite3.Connection, job_ids: Iterable[str]) -> int:
    """Delete every op of these jobs; return how many rows went."""
    cur = conn.executemany("DELETE FROM job_deltas WHERE id = ?", [(i,) for i in job_ids])
    return max(cur.rowcount, 0)


def delete_queue_deltas(conn: sqlite3.Connection, queues: Iterable[str]) -> int:
    """Delete the ops of every stored job of these queues (before the jobs themselves)."""
    sql = "DELETE FROM job_deltas WHERE id IN (SELECT id FROM jobs WHERE queue = ?)"
    cur = conn.executemany(sql, [(q,) for q in queues])
    return max(cur.rowcount, 0)


def delta_lengths(conn: sqlite3.Connection, job_ids: Collection[str]) -> dict[str, int]:
    """Bytes of ops stored per job, for those of `job_ids` that have any."""
    sql = "SELECT id, sum(length(d)) FROM job_deltas WHERE id IN ({marks}) GROUP BY id"
    return {job_id: int(size) for job_id, size in _rows_of(conn, sql, job_ids)}


def read_deltas(conn: sqlite3.Connection, job_ids: Collection[str]) -> dict[str, list[bytes]]:
    """The encoded ops of each of `job_ids` that has any, in the order they were appended."""
    out: dict[str, list[bytes]] = {}
    sql = "SELECT id, d FROM job_deltas WHERE id IN ({marks}) ORDER BY rowid"
    for job_id, op in _rows_of(conn, sql, job_ids):
        out.setdefault(job_id, []).append(op)
    return out


def _rows_of(conn: sqlite3.Connection, sql: str, job_ids: Collection[str]) -> Iterator[Any]:
    """The rows of `sql` (its `{marks}` the placeholders of an `IN` list) for `job_ids`, in
    chunks of `_CHUNK` ids: SQLite caps the number of variables in one statement."""
    ids = list(job_ids)
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        yield from conn.execute(sql.format(marks=", ".join("?" * len(chunk))), chunk)


def apply_ops(rec: Record, ops: Iterable[bytes], decode: Callable[[bytes], Any]) -> Record:
    """`rec` with the encoded ops applied in order. Raises `ValueError` for a bad op."""
    for op in ops:
        apply_delta(rec, decode(op))
    finish_deltas(rec)
    return rec
