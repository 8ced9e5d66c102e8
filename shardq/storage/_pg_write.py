"""Writing a coalesced `Plan` to PostgreSQL (inside the caller's transaction and pipeline).

The rows are the SQLite store's (`_write` says what a plan's rows become and why); only the
statements differ. The batch's puts are one INSERT over arrays (`unnest`, a column each), its
updates one UPDATE over arrays per list of columns they set, its deletions by key one statement
over an array; the rarer rows (delta ops, queue configs, crons ...) go in an `executemany`.
The caller runs the whole write in one pipeline: psycopg sends every statement of the batch
without waiting for its answer, so a batch costs about one round trip to the server plus its
commit, whatever its size. Row counts are read once the pipeline has synced
(`Writes.totals`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from shardq.core._mutations import Record
from shardq.storage._coalesce import Plan, Stored
from shardq.storage._cold import cold_state
from shardq.storage._cold_count_table import PG_SKIP_SETTING
from shardq.storage._encode import COLUMN_FIELDS
from shardq.storage._write import (
    COLD_COLUMNS,
    HOT_ROW,
    Pack,
    Refill,
    absorb_survivor,
    add_update,
    fold,
    survivors_of,
    whole_row,
)

__all__ = ["Writes", "read_deltas", "write_plan"]

Conn = psycopg.Connection[TupleRow]

_COLUMN = {name: "run_at" if name == "runAt" else name for name in COLUMN_FIELDS}
# The array type of each column, for `unnest`.
_ARRAY = {"queue": "text[]", "state": "text[]", "priority": "float8[]"}
_ARRAY |= {"run_at": "bigint[]", "seq": "bigint[]", "rec": "bytea[]", "patch": "bytea[]"}
# A batch's puts as one statement over arrays, a column each: the server plans it once and
# psycopg dumps each array in one go, where an `executemany` binds and runs a statement per
# row (on a push->pull->ack batch that was most of the client's CPU).
_UPSERT_JOB = (
    "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec, patch)"
    " SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::float8[], %b::bigint[],"
    " %b::bigint[], %b::bytea[], %b::bytea[])"
    # An in-place update keeps `ord`, so the order among equal seqs stays (SQLite's rowid).
    # A put replaces the whole row: one of a hot record leaves the cold columns NULL (`_cold`).
    " ON CONFLICT (id) DO UPDATE SET queue = excluded.queue, state = excluded.state,"
    " priority = excluded.priority, run_at = excluded.run_at, seq = excluded.seq,"
    " rec = excluded.rec, patch = excluded.patch, cold = NULL, lifo = NULL, gid = NULL,"
    " ukey = NULL"
)
# A cold record's put: the same with its cold columns.
_UPSERT_COLD_JOB = (
    "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec, patch, cold, lifo, gid,"
    " ukey, made) SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::float8[],"
    " %b::bigint[], %b::bigint[], %b::bytea[], %b::bytea[], %b::smallint[], %b::smallint[],"
    " %b::text[], %b::text[], %b::bigint[])"
    " ON CONFLICT (id) DO UPDATE SET queue = excluded.queue, state = excluded.state,"
    " priority = excluded.priority, run_at = excluded.run_at, seq = excluded.seq,"
    " rec = excluded.rec, patch = excluded.patch, cold = excluded.cold, lifo = excluded.lifo,"
    " gid = excluded.gid, ukey = excluded.ukey, made = excluded.made"
)
# The same at a schema with the cold columns but not yet `made` (versions 6 and 7).
_UPSERT_COLD_JOB_V6 = (
    "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec, patch, cold, lifo, gid,"
    " ukey) SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::float8[],"
    " %b::bigint[], %b::bigint[], %b::bytea[], %b::bytea[], %b::smallint[], %b::smallint[],"
    " %b::text[], %b::text[])"
    " ON CONFLICT (id) DO UPDATE SET queue = excluded.queue, state = excluded.state,"
    " priority = excluded.priority, run_at = excluded.run_at, seq = excluded.seq,"
    " rec = excluded.rec, patch = excluded.patch, cold = excluded.cold, lifo = excluded.lifo,"
    " gid = excluded.gid, ukey = excluded.ukey"
)
# A schema older than the cold columns (tests build one) gets rows without them.
_UPSERT_PLAIN_JOB = (
    "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec, patch)"
    " SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::float8[], %b::bigint[],"
    " %b::bigint[], %b::bytea[], %b::bytea[])"
    " ON CONFLICT (id) DO UPDATE SET queue = excluded.queue, state = excluded.state,"
    " priority = excluded.priority, run_at = excluded.run_at, seq = excluded.seq,"
    " rec = excluded.rec, patch = excluded.patch"
)
_SET_COLD = "UPDATE jobs SET cold = %s, lifo = %s, gid = %s, ukey = %s, made = %s WHERE id = %s"
_SET_COLD_V6 = "UPDATE jobs SET cold = %s, lifo = %s, gid = %s, ukey = %s WHERE id = %s"
_DELETE_JOBS = "DELETE FROM jobs WHERE id = ANY(%s::text[])"
_DELETE_DELTAS = "DELETE FROM job_deltas WHERE id = ANY(%s::text[])"
_INSERT_DELTA = "INSERT INTO job_deltas (id, d) VALUES (%s, %s)"
_FOLDED = "UPDATE jobs SET rec = %s, patch = ''::bytea WHERE id = %s"


def _update_sql(names: tuple[str, ...]) -> str:
    """One UPDATE of every row that sets these columns: its values as arrays (the columns,
    then the patches to append, then the ids), joined to the rows by id."""
    columns = [_COLUMN[name] for name in names]
    sets = "".join(f"{c} = u.{c}, " for c in columns)
    arrays = ", ".join(f"%b::{_ARRAY[c]}" for c in columns) + (", " if columns else "")
    names_of_u = ", ".join([*columns, "patch", "id"])
    return (
        f"UPDATE jobs AS j SET {sets}patch = j.patch || u.patch"
        f" FROM unnest({arrays}%b::bytea[], %b::text[]) AS u({names_of_u}) WHERE j.id = u.id"
    )


# One statement per list of updated columns: a handful in practice.
_UPDATE_SQL: dict[tuple[str, ...], str] = {}


class Writes:
    """The statements of one batch: their cursors, so the rows each wrote can be summed once
    the pipeline has synced (a cursor's count is unknown before)."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self._counted: list[tuple[psycopg.Cursor[TupleRow], int]] = []

    def many(self, sql: str, rows: list[tuple[Any, ...]], deltas: int = 0) -> None:
        """`sql` once per row. `deltas`: +1 if it adds `job_deltas` rows, -1 if it deletes."""
        cur = self.conn.cursor()
        cur.executemany(sql, rows)
        self._counted.append((cur, deltas))

    def one(self, sql: str, params: tuple[Any, ...], deltas: int = 0) -> None:
        cur = self.conn.cursor()
        cur.execute(sql, params)
        self._counted.append((cur, deltas))

    def totals(self) -> tuple[int, int]:
        """(rows written, change in `job_deltas` rows), once the pipeline has synced."""
        written = delta_rows = 0
        for cur, deltas in self._counted:
            rows = max(cur.rowcount, 0)
            written += rows
            delta_rows += deltas * rows
        return written, delta_rows


def write_plan(
    writes: Writes,
    plan: Plan,
    pack: Pack,
    patch_floor: int,
    deltas_exist: bool,
    *,
    cold: int = COLD_COLUMNS,
    counted: bool = False,
) -> dict[str, Stored | None]:
    """Queue the statements that write `plan`; return what is now known of every job it
    touched (None: the row is gone). `deltas_exist`: whether `job_deltas` may hold a row.
    Raises what psycopg and msgpack raise, and `StorageRejected` for a row whose column
    fields are missing or mistyped; the caller's transaction rolls back. `counted`: whether
    the count trigger can be kept out of a statement (`_cold_count_table.PG_SKIP_SETTING`)."""
    if plan.obliterated:
        _obliterate(writes, plan, deltas_exist, counted)
    known: dict[str, Stored | None] = {}
    _write_jobs(writes, plan, pack, patch_floor, deltas_exist, known, cold)
    _write_keyed(writes, plan.queues, "queue_state", ("name", "cfg"), lambda k, r: (k, pack(r)))
    if plan.cron_drops:  # before the upserts: a schedule saved in this batch stays
        sql = "DELETE FROM cron_jobs WHERE name = %s AND queue = %s"
        writes.many(sql, list(plan.cron_drops))
    if plan.crons:
        cron_row = _with_queue("queue", pack)
        _write_keyed(writes, plan.crons, "cron_jobs", ("name", "queue", "rec"), cron_row)
    if plan.webhooks:
        _write_keyed(writes, plan.webhooks, "webhooks", ("id", "rec"), lambda k, r: (k, pack(r)))
    if plan.flows:
        _write_keyed(
            writes, plan.flows, "flow_outbox", ("key", "queue", "rec"), _with_queue("cq", pack)
        )
    if plan.groups:
        _write_groups(writes, plan, pack)
    return known


def _write_jobs(
    writes: Writes,
    plan: Plan,
    pack: Pack,
    patch_floor: int,
    deltas_exist: bool,
    known: dict[str, Stored | None],
    cold: int,
) -> None:
    deleted: list[str] = []
    whole: list[tuple[Any, ...]] = []
    cold_rows: list[tuple[Any, ...]] = []
    updates: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    to_fold: list[str] = []
    ops: list[tuple[str, bytes]] = []
    refill: Refill = []
    for job_id, row in plan.jobs.items():
        if row is None:
            deleted.append(job_id)
            known[job_id] = None
        elif row.values is not None:
            one = whole_row(job_id, row, row.values, pack, patch_floor, known)
            (whole if len(one) == HOT_ROW else cold_rows).append(one)
        elif add_update(job_id, row, pack, patch_floor, updates, known, ops, refill):
            to_fold.append(job_id)
    if deltas_exist and (deleted or whole or cold_rows):
        # A put replaces the whole record, ops included (a batch resent to a new writer).
        gone = deleted + [w[0] for w in whole] + [w[0] for w in cold_rows]
        writes.one(_DELETE_DELTAS, (gone,), deltas=-1)
    if deleted:
        writes.one(_DELETE_JOBS, (deleted,))
    if whole or cold_rows:
        _write_whole(writes, whole, cold_rows, cold)
    for names, rows in updates.items():
        sql = _UPDATE_SQL.get(names) or _UPDATE_SQL.setdefault(names, _update_sql(names))
        priority_at = names.index("priority") if "priority" in names else -1
        run_at = names.index("runAt") if "runAt" in names else -1
        writes.one(sql, _columns(rows, priority_at, run_at))
    if refill and cold:
        _refill(writes, refill, cold)
    if ops:
        writes.many(_INSERT_DELTA, list(ops), deltas=1)
    if to_fold:
        _fold_stored(writes, to_fold, pack, known)


def _write_whole(
    writes: Writes, whole: list[tuple[Any, ...]], cold_rows: list[tuple[Any, ...]], cold: int
) -> None:
    """Upsert the rows put in the batch (`_write_puts._write_whole`)."""
    if not cold:
        rows = whole + [one[:HOT_ROW] for one in cold_rows]
        writes.one(_UPSERT_PLAIN_JOB, _columns(rows, *_WHOLE_NUMBERS))
        return
    if whole:
        writes.one(_UPSERT_JOB, _columns(whole, *_WHOLE_NUMBERS))
    if cold_rows and cold < COLD_COLUMNS:
        rows = [one[: HOT_ROW + cold] for one in cold_rows]
        writes.one(_UPSERT_COLD_JOB_V6, _columns(rows, *_WHOLE_NUMBERS))
    elif cold_rows:
        writes.one(_UPSERT_COLD_JOB, _columns(cold_rows, *_WHOLE_NUMBERS))


def _refill(writes: Writes, refill: Refill, cold: int) -> None:
    """Set the cold columns of the stored jobs a change in the batch marked from their merged
    records (`_write._refill`), read after the batch's updates (sent before this read)."""
    sql = "SELECT id, rec, patch FROM jobs WHERE id = ANY(%s::text[])"
    for mark in (1, 0):
        ids = [job_id for job_id, m in refill if m == mark]
        if not ids:
            continue
        only_cold = "" if mark else " AND cold = 1"
        rows = writes.conn.execute(sql + only_cold, (ids,), binary=True).fetchall()
        sets = [(*cold_state(rec, patch)[:cold], job_id) for job_id, rec, patch in rows]
        if sets:
            writes.many(_SET_COLD if cold == COLD_COLUMNS else _SET_COLD_V6, sets)


# The columns of a whole row (the id first, then `COLUMN_FIELDS`) an array must be made
# uniform for: a priority may come as an int or a float, a run_at as a float.
_WHOLE_NUMBERS = (1 + COLUMN_FIELDS.index("priority"), 1 + COLUMN_FIELDS.index("runAt"))


def _columns(rows: list[tuple[Any, ...]], priority_at: int, run_at: int) -> tuple[list[Any], ...]:
    """`rows` as one list per column, for `unnest` (an array holds values of one type): a
    priority goes as a float and a run_at as an int, as their columns store them. Raises
    ValueError or TypeError for a value neither can be (the batch is rejected)."""
    columns = tuple(list(column) for column in zip(*rows, strict=True))
    if priority_at >= 0:
        column = columns[priority_at]
        column[:] = [None if p is None else float(p) for p in column]
    if run_at >= 0:
        column = columns[run_at]
        column[:] = [v if v is None or type(v) is int else int(v) for v in column]
    return columns


def _obliterate(writes: Writes, plan: Plan, deltas_exist: bool, counted: bool) -> None:
    """Delete the obliterated queues' jobs, their ops and their group rows, before any row of
    the batch is written: a put later in the batch for that queue must survive it. With
    `counted`, their cold counts go with one statement, not a trigger call per row (whose
    updates of one counts row cost quadratic time in one transaction: `_cold_count_table`)."""
    _materialize_survivors(writes.conn, plan)
    queues = (list(plan.obliterated),)
    if deltas_exist:
        sql = "DELETE FROM job_deltas WHERE id IN (SELECT id FROM jobs WHERE queue = ANY(%s))"
        writes.one(sql, queues, deltas=-1)
    setting = writes.conn.cursor()  # not counted as rows written
    if counted:
        setting.execute("SELECT set_config(%s, 'on', true)", (PG_SKIP_SETTING,))
    writes.one("DELETE FROM jobs WHERE queue = ANY(%s::text[])", queues)
    if counted:
        setting.execute("SELECT set_config(%s, 'off', true)", (PG_SKIP_SETTING,))
        setting.execute("DELETE FROM cold_counts WHERE queue = ANY(%s::text[])", queues)
    writes.one("DELETE FROM queue_groups WHERE queue = ANY(%s::text[])", queues)


def _materialize_survivors(conn: Conn, plan: Plan) -> None:
    """Turn updates of stored rows whose stored queue is obliterated into whole rows (see
    `_write._materialize_survivors`: a change before the `qdel` moved them elsewhere)."""
    survivors = survivors_of(plan)
    if not survivors:
        return
    sql = (
        "SELECT id, queue, state, priority, run_at, seq, rec, patch FROM jobs"
        " WHERE id = ANY(%s::text[])"
    )
    ids = list(survivors)
    stored_ops = read_deltas(conn, ids)
    for job_id, *values, rec, patch in conn.execute(sql, (ids,), binary=True).fetchall():
        absorb_survivor(survivors[job_id], values, rec, patch, stored_ops.get(job_id, ()))


def _fold_stored(
    writes: Writes, job_ids: list[str], pack: Pack, known: dict[str, Stored | None]
) -> None:
    """Fold the patch and ops of these stored jobs into their records (read after the
    batch's own updates, which the pipeline has sent before this read)."""
    conn = writes.conn
    stored_ops = read_deltas(conn, job_ids)
    sql = "SELECT id, rec, patch FROM jobs WHERE id = ANY(%s::text[])"
    folded: list[tuple[bytes, str]] = []
    for job_id, rec, patch in conn.execute(sql, (job_ids,), binary=True).fetchall():
        new_rec, new_patch = fold(rec, patch, pack, stored_ops.get(job_id, ()))
        if not new_patch:
            folded.append((new_rec, job_id))
            info = known[job_id]
            assert info is not None
            known[job_id] = (info[0], len(new_rec), 0, 0)
    if folded:
        writes.many(_FOLDED, list(folded))
        writes.one(_DELETE_DELTAS, ([job_id for _, job_id in folded],), deltas=-1)


def read_deltas(conn: Conn, job_ids: list[str]) -> dict[str, list[bytes]]:
    """The encoded ops of each of `job_ids` that has any, in the order they were appended."""
    out: dict[str, list[bytes]] = {}
    sql = "SELECT id, d FROM job_deltas WHERE id = ANY(%s::text[]) ORDER BY ord"
    for job_id, op in conn.execute(sql, (job_ids,), binary=True).fetchall():
        out.setdefault(job_id, []).append(op)
    return out


def _with_queue(field: str, pack: Pack) -> Callable[[str, Record], tuple[Any, ...]]:
    return lambda key, rec: (key, str(rec.get(field)), pack(rec))


def _write_keyed(
    writes: Writes,
    items: dict[str, Record | None],
    table: str,
    columns: tuple[str, ...],
    row: Callable[[str, Record], tuple[Any, ...]],
) -> None:
    """Upsert the records of `items` (a row each, from `row`) and delete the keys mapped to
    None: the small keyed tables (queues, cron schedules, webhooks, the flow outbox)."""
    key, rest = columns[0], columns[1:]
    rows = [row(k, rec) for k, rec in items.items() if rec is not None]
    if rows:
        marks = ", ".join(["%s"] * len(columns))
        sets = ", ".join(f"{c} = excluded.{c}" for c in rest)
        upsert = (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
            f" ON CONFLICT ({key}) DO UPDATE SET {sets}"
        )
        writes.many(upsert, rows)
    dropped = [k for k, rec in items.items() if rec is None]
    if dropped:
        writes.one(f"DELETE FROM {table} WHERE {key} = ANY(%s::text[])", (dropped,))


_UPSERT_GROUP = (
    "INSERT INTO queue_groups (queue, gid, cfg) VALUES (%s, %s, %s)"
    " ON CONFLICT (queue, gid) DO UPDATE SET cfg = excluded.cfg"
)


def _write_groups(writes: Writes, plan: Plan, pack: Pack) -> None:
    rows = [(q, gid, pack(cfg)) for (q, gid), cfg in plan.groups.items() if cfg is not None]
    if rows:
        writes.many(_UPSERT_GROUP, rows)
    dropped = [key for key, cfg in plan.groups.items() if cfg is None]
    if dropped:
        writes.many("DELETE FROM queue_groups WHERE queue = %s AND gid = %s", dropped)
