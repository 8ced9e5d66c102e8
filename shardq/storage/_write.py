"""Writing a coalesced `Plan` to the `jobs` and `queue_state` tables (inside a transaction).

A job row is `rec` (an encoded record) plus `patch` (encoded change maps, each after its
4-byte length; see `shardq.storage._store` for why). The plan's rows become:

- a job put in the batch: one UPSERT of the whole row, `rec` from the put and `patch` the
  changes that followed it in the batch (usually none, or a lease and a completion);
- a stored job the batch only updates: one UPDATE that sets the columns its changes touched
  and appends the changes to `patch`; `rec` is neither read nor written. The statement names
  only those columns, so SQLite rewrites only the indexes over them.

Each of these statements runs over many rows at once (`_rows`), not once per row. A job the
engine marked cold also gets its cold columns (`_cold`), which no hot row carries.

A patch that grows longer than its record (and than `patch_floor`) is folded into the record:
decoded, merged and written back as `rec` with an empty patch. Folding costs one decode and
encode of the record and only happens after at least a record's length of changes was
appended, so rows stay at most about twice their merged size and the cost per change stays
constant.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core._mutations import Record, apply_delta, finish_deltas
from shardq.core._record import drop_defaults, fill_record
from shardq.storage._coalesce import (
    Plan,
    Row,
    Stored,
    check_columns,
    check_values,
    expand_runs,
)
from shardq.storage._cold import COLD_COLUMN, REFILL, cold_state
from shardq.storage._deltas import (
    DELTA_KEY,
    apply_ops,
    delete_deltas,
    delete_queue_deltas,
    insert_deltas,
    read_deltas,
    wrap,
)
from shardq.storage._encode import COLUMN_FIELDS
from shardq.storage._patch import FRAME as _FRAME
from shardq.storage._patch import join_patch, merged_patch
from shardq.storage._patch import read_frame as _read_frame
from shardq.storage._runs import Run
from shardq.storage._write_keyed import Pack, write_keyed_tables
from shardq.storage._write_puts import COLD_COLUMNS, HOT_ROW, write_replaced
from shardq.storage._write_updates import BLOB, Group, Updates, write_groups, write_updates

__all__ = [
    "COLD_COLUMNS",
    "FETCH_CHUNK",
    "HOT_ROW",
    "Pack",
    "Refill",
    "add_runs",
    "add_update",
    "chunks",
    "decode",
    "fold",
    "join_patch",
    "merge_patch",
    "merge_row",
    "whole_row",
    "write_plan",
]

Refill = list[tuple[str, int]]
"""Stored jobs whose cold columns are set from their merged record once the batch's updates
are written: (job id, the mark of `_cold.cold_mark`)."""

# Stays under SQLite's historical 999 bound parameters per statement.
FETCH_CHUNK = 500
_COLUMNS = len(COLUMN_FIELDS)

_SET_COLD = "UPDATE jobs SET cold = ?, lifo = ?, gid = ?, ukey = ?, made = ? WHERE id = ?"
_SET_COLD_V9 = "UPDATE jobs SET cold = ?, lifo = ?, gid = ?, ukey = ? WHERE id = ?"
_DELETE_QUEUE_JOBS = "DELETE FROM jobs WHERE queue = ?"
_DELETE_QUEUE_GROUPS = "DELETE FROM queue_groups WHERE queue = ?"
_FOLDED = "UPDATE jobs SET rec = ?, patch = x'' WHERE id = ?"


def write_plan(
    conn: sqlite3.Connection,
    plan: Plan,
    pack: Pack,
    patch_floor: int,
    deltas_exist: bool,
    *,
    cold: int = COLD_COLUMNS,
) -> tuple[int, dict[str, Stored | None], int]:
    """Write `plan`; return the rows written, what is now known of every job it touched
    (None: the row is gone) and the change in the number of `job_deltas` rows.
    `deltas_exist`: whether that table may hold a row (if not, no job's ops need deleting).
    `cold`: how many of the cold columns (`_cold`) the table has: 0 before they came, 4
    before `made` came, else `COLD_COLUMNS`.
    Raises what sqlite3 and msgpack raise, and `StorageError` for a row whose column fields
    are missing or mistyped; the caller's transaction rolls back."""
    written = delta_rows = 0
    if plan.obliterated:
        expand_runs(plan)  # a run's stored queue may be one of them (`_materialize_survivors`)
        written, delta_rows = _obliterate(conn, plan, deltas_exist)
    known: dict[str, Stored | None] = {}
    rows, changed = _write_jobs(conn, plan, pack, patch_floor, deltas_exist, known, cold)
    written += rows
    delta_rows += changed
    written += write_keyed_tables(conn, plan, pack)
    return written, known, delta_rows


def _write_jobs(
    conn: sqlite3.Connection,
    plan: Plan,
    pack: Pack,
    patch_floor: int,
    deltas_exist: bool,
    known: dict[str, Stored | None],
    cold: int,
) -> tuple[int, int]:
    """Write the plan's job rows and ops; (rows written, change in `job_deltas` rows)."""
    written = delta_rows = 0
    deleted: list[tuple[str]] = []
    whole: list[tuple[Any, ...]] = []
    cold_rows: list[tuple[Any, ...]] = []
    updates: Updates = {}
    to_fold: list[str] = []
    ops: list[tuple[str, bytes]] = []
    refill: Refill = []
    joined: Shared = {}
    fresh = 0  # the rows of `whole` without their patch (`FRESH_ROW` long)
    for job_id, row in plan.jobs.items():
        if row is None:
            deleted.append((job_id,))
            known[job_id] = None
        elif (values := row.values) is not None:
            rec = row.rec
            if (
                type(rec) is bytes
                and not row.patch
                and not row.kept
                and len(values) == _COLUMNS
                and type(values[0]) is str
                and type(values[1]) is str
                and type(values[4]) is int
            ):
                # The usual put: a hot record, encoded, that no change followed in the batch
                # (`whole_row`'s result, without the call: this runs for most puts).
                known[job_id] = (values[0], len(rec), 0, 0)
                whole.append((job_id, *values, BLOB(rec)))
                fresh += 1
                continue
            one = whole_row(job_id, row, values, pack, patch_floor, known, BLOB)
            (whole if len(one) == HOT_ROW else cold_rows).append(one)
        elif add_update(
            job_id, row, pack, patch_floor, updates, known, ops, refill, joined, plan.shared
        ):
            to_fold.append(job_id)
    if plan.runs:
        add_runs(plan, pack, patch_floor, known, joined, to_fold)
    if deleted or whole or cold_rows:
        written, delta_rows = write_replaced(
            conn, deleted, (whole, fresh), cold_rows, deltas_exist, cold
        )
    if joined:
        written += write_groups(conn, joined.values(), updates, cold)
    for names, rows in updates.items():
        written += write_updates(conn, names, rows, cold)
    if refill and cold:
        _refill(conn, refill, cold)
    if ops:
        insert_deltas(conn, ops)
        written += len(ops)
        delta_rows += len(ops)
    if to_fold:
        delta_rows -= _fold_stored(conn, to_fold, pack, known)
    return written, delta_rows


def _refill(conn: sqlite3.Connection, refill: Refill, cold: int) -> None:
    """Set the cold columns of the stored jobs a change in the batch marked (`_cold`) from
    their merged records, read after the batch's updates: a change that made a job cold
    (mark 1) sets them on any row, another one (mark 0) only on a row that is cold."""
    for mark in (1, 0):
        ids = [job_id for job_id, m in refill if m == mark]
        only_cold = "" if mark else " AND cold = 1"
        for chunk in chunks(ids, FETCH_CHUNK):
            sql = f"SELECT id, rec, patch FROM jobs WHERE id IN ({', '.join('?' * len(chunk))})"
            rows = conn.execute(sql + only_cold, chunk).fetchall()
            sets = [(*cold_state(rec, patch)[:cold], job_id) for job_id, rec, patch in rows]
            conn.executemany(_SET_COLD if cold == COLD_COLUMNS else _SET_COLD_V9, sets)


def _obliterate(conn: sqlite3.Connection, plan: Plan, deltas_exist: bool) -> tuple[int, int]:
    """Delete the obliterated queues' jobs, their ops and their group rows; (rows written,
    change in `job_deltas` rows)."""
    _materialize_survivors(conn, plan)
    delta_rows = -delete_queue_deltas(conn, plan.obliterated) if deltas_exist else 0
    # Before the job and group rows: a put later in the batch for that queue must survive it.
    queues = [(name,) for name in plan.obliterated]
    written: int = conn.executemany(_DELETE_QUEUE_JOBS, queues).rowcount
    written += conn.executemany(_DELETE_QUEUE_GROUPS, queues).rowcount
    return written, delta_rows


def whole_row(
    job_id: str,
    row: Row,
    values: list[Any],
    pack: Pack,
    patch_floor: int,
    known: dict[str, Stored | None],
    blob: Callable[[bytes], Any] = bytes,
) -> tuple[Any, ...]:
    """The tuple a put's row is written with: `HOT_ROW` long for a hot record, with the five
    cold columns after it for a cold one (`_cold`). `blob` makes the parameters of `rec` and
    `patch` (`BLOB`, for SQLite)."""
    # `check_values`'s test inline (it raises naming the field): this runs for every put.
    if type(values[0]) is not str or type(values[1]) is not str or type(values[4]) is not int:
        check_values(job_id, values)
    rec = row.rec if type(row.rec) is bytes else pack(row.rec)
    # Most puts come with no change after them in the batch, or were stored whole before.
    patch = row.kept + join_patch(row.patch, pack) if row.patch else row.kept
    if patch and len(patch) > patch_floor and len(patch) > len(rec):
        rec, patch = fold(rec, patch, pack)
    known[job_id] = (values[0], len(rec), len(patch), 0)
    if len(values) == _COLUMNS:
        return (job_id, *values, blob(rec), blob(patch))
    columns = values[:_COLUMNS]
    if values[_COLUMNS] is REFILL:
        state = cold_state(rec, patch)
        if state[0] is None:
            return (job_id, *columns, blob(rec), blob(patch))
        return (job_id, *columns, blob(rec), blob(patch), *state)
    return (job_id, *columns, blob(rec), blob(patch), 1, *values[_COLUMNS:])


Shared = dict[tuple[int, ...], "Group | None"]
"""The changes of stored rows joined so far for one plan (`add_update`), by the identities of
their parts: the `Group` of the rows that take it, or None for parts that may not name one
change."""


def add_update(
    job_id: str,
    row: Row,
    pack: Pack,
    patch_floor: int,
    updates: Updates,
    known: dict[str, Stored | None],
    ops: list[tuple[str, bytes]],
    refill: Refill,
    joined: Shared | None = None,
    shared_parts: Collection[int] = (),
) -> bool:
    """Queue the UPDATE of a stored row (none if only ops came) and its ops, and in `refill`
    the row if a change named a cold field (`_cold`); True if its patch or its ops are now
    due to be folded. `joined`: the changes of the rows done so far for this plan (`Shared`):
    jobs updated together (an `updm`) share their change objects, so their columns are
    checked and their patch joined once, not once per job; and merged into one entry once
    where every part is one of `shared_parts` (`Plan.shared`, `_patch`). Such a row's id
    goes into its change's `Group` (`_write_updates.write_groups`), not into `updates`."""
    assert row.stored is not None
    queue, rec_len, patch_len, delta_len = row.stored
    changed = row.changed
    if row.patch or changed:
        shared = None
        if joined is not None and COLD_COLUMN not in changed:
            key = tuple(map(id, row.patch))
            shared = joined.get(key, _UNSEEN)
            if shared is _UNSEEN:
                shared = joined[key] = _shared_change(job_id, row, pack, shared_parts)
        if shared is not None:
            shared[2].append(job_id)
            patch_len += len(shared[1][-1])
        else:
            names, params = _own_change(job_id, row, pack, refill)
            rows = updates.get(names)
            if rows is None:
                updates[names] = [params]
            else:
                rows.append(params)
            patch_len += len(params[-2])
        if "queue" in changed:
            queue = changed["queue"]
    if row.deltas:
        for op in row.deltas:
            blob = op if type(op) is bytes else pack(op)
            ops.append((job_id, blob))
            delta_len += len(blob)
        grown = max(patch_len, delta_len)
    else:
        grown = patch_len
    known[job_id] = (queue, rec_len, patch_len, delta_len)
    return grown > patch_floor and grown > rec_len


_UNSEEN: Any = object()


def add_runs(
    plan: Plan,
    pack: Pack,
    patch_floor: int,
    known: dict[str, Stored | None],
    joined: Shared,
    to_fold: list[str],
) -> None:
    """`add_update` of every job in `plan.runs` (`_runs`): each run's change is made once
    (`_shared_change`, keyed in `joined` as a row with the same parts would be), and each
    job only adds its id to it, its summary to `known` and, if its patch is now due to be
    folded, its id to `to_fold`."""
    stored, jobs = plan.stored, plan.jobs
    last: Any = None
    ids: list[str] = []
    grow, moved = 0, None
    for job_id, run in plan.runs.items():
        if job_id in jobs:  # put or deleted after the run's changes: `jobs` says what it is
            continue
        if run is not last:
            last = run
            key = tuple(map(id, run.patch))
            group = joined.get(key, _UNSEEN)
            if group is _UNSEEN:
                group = joined[key] = _shared_change(job_id, run, pack, plan.shared)
            # A run's parts are never 0- or 1-byte bytes objects (`_coalesce`): never None.
            assert group is not None
            ids, grow = group[2], len(group[1][-1])
            moved = run.changed.get("queue")
        ids.append(job_id)
        queue, rec_len, patch_len, delta_len = stored[job_id]
        patch_len += grow
        known[job_id] = (queue if moved is None else moved, rec_len, patch_len, delta_len)
        if patch_len > patch_floor and patch_len > rec_len:
            to_fold.append(job_id)


def _shared_change(
    job_id: str, row: Row | Run, pack: Pack, shared_parts: Collection[int]
) -> Group | None:
    """A stored row's change, for every row whose patch has the same parts (`Shared`): its
    column fields and their values, then its joined patch (merged into one entry if every
    part is one of `shared_parts`, `_patch`). A row's `changed` follows from the
    mutations that made its patch (a stored row starts with none), and each part is one
    mutation's object: a change map of the engine's (its columns are read from it) or the
    bytes an encoded one came in. But CPython keeps one object for every bytes value of 0 or
    1 byte, so such a part may stand for mutations with different column fields: None."""
    for part in row.patch:
        if type(part) is bytes and len(part) < 2:
            return None
    changed = row.changed
    check_columns(job_id, changed)
    patch = join_patch(row.patch, pack)
    if len(row.patch) > 1 and all(id(part) in shared_parts for part in row.patch):
        patch = merged_patch(patch, pack) or patch
    return tuple(changed), (*changed.values(), patch), []


def _own_change(
    job_id: str, row: Row, pack: Pack, refill: Refill
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """A stored row's change on its own: (its column fields, their values, its patch, its id)."""
    changed = row.changed
    patch = join_patch(row.patch, pack)
    if COLD_COLUMN in changed:
        refill.append((job_id, changed.pop(COLD_COLUMN)))
    check_columns(job_id, changed)
    return tuple(changed), (*changed.values(), patch, job_id)


def _materialize_survivors(conn: sqlite3.Connection, plan: Plan) -> None:
    """Turn updates of stored rows whose stored queue is obliterated into whole rows.

    Such a row survives the batch only if a change before the `qdel` moved it to another
    queue; its stored row is about to be deleted with the queue, so it is read first and
    written back whole. Rare: the engine never moves a job between queues today.
    """
    survivors = survivors_of(plan)
    sql = "SELECT id, queue, state, priority, run_at, seq, rec, patch FROM jobs WHERE id IN"
    for chunk in chunks(list(survivors), FETCH_CHUNK):
        marks = ", ".join("?" * len(chunk))
        stored_ops = read_deltas(conn, chunk)
        for job_id, *values, rec, patch in conn.execute(f"{sql} ({marks})", chunk):
            absorb_survivor(survivors[job_id], values, rec, patch, stored_ops.get(job_id, ()))


def survivors_of(plan: Plan) -> dict[str, Row]:
    """The rows of `plan` updating a stored job whose stored queue it obliterates."""
    return {
        job_id: row
        for job_id, row in plan.jobs.items()
        if row is not None and row.stored is not None and row.stored[0] in plan.obliterated
    }


def absorb_survivor(
    row: Row, values: list[Any], rec: bytes, patch: bytes, ops: Iterable[Any]
) -> None:
    """Make `row` whole from its stored columns, record, patch and ops (which are deleted
    with the queue's rows: they go along in its patch), its own changes on top. Its cold
    columns are set from its merged record when it is written (`_cold`)."""
    patch += join_patch([wrap(op) for op in ops], lambda v: b"")
    for name, value in row.changed.items():
        if name != COLD_COLUMN:
            values[COLUMN_FIELDS.index(name)] = value
    values.append(REFILL)
    row.values, row.rec, row.kept = values, rec, patch
    row.changed, row.stored = {}, None


def _fold_stored(
    conn: sqlite3.Connection, job_ids: list[str], pack: Pack, known: dict[str, Stored | None]
) -> int:
    """Fold the patch and ops of these stored jobs into their records; return how many
    `job_deltas` rows went."""
    folded: list[tuple[bytes, str]] = []
    for chunk in chunks(job_ids, FETCH_CHUNK):
        marks = ", ".join("?" * len(chunk))
        sql = f"SELECT id, rec, patch FROM jobs WHERE id IN ({marks})"
        stored_ops = read_deltas(conn, chunk)
        for job_id, rec, patch in conn.execute(sql, chunk):
            new_rec, new_patch = fold(rec, patch, pack, stored_ops.get(job_id, ()))
            if not new_patch:
                folded.append((new_rec, job_id))
                info = known[job_id]
                assert info is not None
                known[job_id] = (info[0], len(new_rec), 0, 0)
    if not folded:
        return 0
    conn.executemany(_FOLDED, folded)
    return delete_deltas(conn, [job_id for _, job_id in folded])


def fold(rec: bytes, patch: bytes, pack: Pack, ops: Iterable[bytes] = ()) -> tuple[bytes, bytes]:
    """`rec` with `patch` merged into it and `ops` (encoded delta ops) applied, and an empty
    patch; unchanged if one is corrupt (folding is only an optimisation: recovery reports
    the corruption). The caller deletes the folded ops."""
    try:
        # Written as records are written: without the fields at their default.
        return pack(drop_defaults(_merged(rec, patch, ops))), b""
    except (ValueError, TypeError, msgpack.UnpackException):
        return rec, patch


def merge_row(rec: bytes, patch: bytes, ops: Iterable[bytes] = ()) -> Record:
    """A stored job's record as every reader takes it: `rec` decoded, `patch` merged in,
    then its ops applied, and the fields a record leaves out at their default put back
    (`core._record.fill_record`). Raises what `merge_patch` raises, and `ValueError` for a
    bad op."""
    return fill_record(_merged(rec, patch, ops))


def _merged(rec: bytes, patch: bytes, ops: Iterable[bytes]) -> Record:
    return apply_ops(merge_patch(decode(rec), patch), ops, decode)


def decode(blob: bytes) -> Any:
    """One msgpack value, as stored."""
    # strict_map_key=False: a job payload may legitimately use integer map keys, and a record
    # we stored must always load back, or recovery would stop at it.
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)


def merge_patch(rec: Any, patch: bytes) -> Record:
    """`rec` (a decoded record) with every change map in `patch` merged in, in order; an
    entry under `DELTA_KEY` is a delta op, applied (`shardq.core._mutations.apply_delta`).

    Raises `ValueError` if `rec` or a change is not a map or `patch` is cut short, and what
    msgpack raises for bytes that are not one msgpack value.
    """
    if not isinstance(rec, dict):
        raise ValueError(f"a stored job record is not a map: {rec!r:.100}")
    pos, end = 0, len(patch)
    deltas = False
    while pos < end:
        if pos + _FRAME > end:
            raise ValueError("a stored job patch is cut short")
        (size,) = _read_frame(patch, pos)
        start = pos + _FRAME
        pos = start + size
        if pos > end:
            raise ValueError("a stored job patch is cut short")
        changes = decode(patch[start:pos])
        if type(changes) is not dict:
            raise ValueError(f"a stored job change is not a map: {changes!r:.100}")
        if DELTA_KEY in changes:
            apply_delta(rec, changes[DELTA_KEY])
            deltas = True
        else:
            rec.update(changes)
    if deltas:
        finish_deltas(rec)
    return rec


def chunks(items: Collection[str], size: int) -> Iterator[list[str]]:
    """`items` in lists of at most `size`."""
    seq = list(items)
    for start in range(0, len(seq), size):
        yield seq[start : start + size]
