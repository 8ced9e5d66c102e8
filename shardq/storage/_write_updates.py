"""The UPDATEs of stored job rows that a batch changes (SQLite), by the columns they set.

A stored job the batch only updates is written by one UPDATE that sets the columns its
changes touched and appends the changes to its `patch` (`shardq.storage._write`). Jobs leased
or acknowledged together share one change: they come as a `Group` (the columns, their values
and the joined patch once, then every job's id), written as one statement naming their ids
(`_rows.run_keys`). A job with a change of its own comes as a row `(*values, patch, id)`,
and such rows go as one statement over a VALUES table of them (`_rows.run_rows`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any, Final

from shardq.storage._encode import COLUMN_FIELDS
from shardq.storage._rows import SHARED_MIN, run_keys, run_rows

__all__ = ["BLOB", "COLD", "HOT", "Group", "Updates", "write_groups", "write_updates"]

_COLUMN = {name: "run_at" if name == "runAt" else name for name in COLUMN_FIELDS}

BLOB: Final = bytearray
"""What SQLite's writer binds a record or a patch as. Python's sqlite3 binds `int`, `float`,
`str` and `bytearray` as they are, but looks up an adapter for a `bytes` first, and the
failed lookup costs more than copying it into a `bytearray` (0.33 against 0.18 µs per
parameter: bench/results/2026-12-05-s10-writer-cpu.md); a `bytearray` is stored as the same
BLOB."""
HOT, COLD = " AND jobs.cold IS NULL", " AND jobs.cold IS NOT NULL"
"""What an update of stored rows adds to its WHERE. From SQLite schema 14 on, the count
trigger on updates fires only for an UPDATE whose SET names `cold` (`_cold_count_table`), so
an UPDATE that may change a cold row's queue, state, group or priority must set `cold`, if
only to itself. The hot rows go first, with no `cold` in the SET and so no trigger; then,
where that changed fewer rows than it was given, the same rows again with `cold = cold` set,
for the rows it left. A cold row is the budget's: it pays a second lookup; a hot batch, the
usual one, pays nothing more."""


def _update_sql(names: tuple[str, ...], cold: str = "") -> str:
    """The UPDATE of the rows whose changes set these columns: their values, the patches to
    append and the ids come as the VALUES rows (`_rows`), joined to the rows by id. `cold`:
    "" (a table without the cold columns), `HOT` or `COLD`."""
    sets = "".join(f"{_COLUMN[name]} = v.column{i}, " for i, name in enumerate(names, 1))
    sets += "cold = jobs.cold, " if cold == COLD else ""
    patch, key = len(names) + 1, len(names) + 2
    # `||` joins blobs byte for byte (as text, in this UTF-8 database); CAST keeps it a blob.
    return (
        f"UPDATE jobs SET {sets}patch = CAST(patch || v.column{patch} AS BLOB)"
        f" FROM (VALUES {{rows}}) AS v WHERE jobs.id = v.column{key}{cold}"
    )


def _shared_sql(names: tuple[str, ...], cold: str = "") -> str:
    """The UPDATE of rows that all take the same values and patch, named by id (`_rows`
    fills in `{rows}` with the ids' parameters). `cold`: as in `_update_sql`."""
    sets = "".join(f"{_COLUMN[name]} = ?, " for name in names)
    sets += "cold = jobs.cold, " if cold == COLD else ""
    return f"UPDATE jobs SET {sets}patch = CAST(patch || ? AS BLOB) WHERE id IN ({{rows}}){cold}"


# The statements per list of updated columns (in the order the changes named them) and
# `cold` variant: a few hundred at most, a handful in practice.
_UPDATE_SQL: dict[tuple[tuple[str, ...], str], str] = {}
_SHARED_SQL: dict[tuple[tuple[str, ...], str], str] = {}


Group = tuple[tuple[str, ...], tuple[Any, ...], list[str]]
"""Stored rows that take one change: (the columns it sets, their values and the joined
patch, the ids of the rows)."""
Updates = dict[tuple[str, ...], list[tuple[Any, ...]]]
"""Rows of stored jobs with a change of their own, by the columns it sets: `(*values, patch,
id)`."""


def write_updates(
    conn: sqlite3.Connection, names: tuple[str, ...], rows: list[tuple[Any, ...]], cold: int
) -> int:
    """The UPDATEs of the stored rows whose changes set the columns `names`: each row is
    `(*values, patch, id)`. Rows with the same values and patch (`SHARED_MIN` or more: jobs
    leased or acknowledged together, whose changes came as one `updm`) go as one statement
    naming their ids; the rest as one statement over a VALUES table of their own rows.
    `cold`: the cold columns the table has (with them, hot rows and cold rows go apart:
    `HOT`)."""
    width = len(names) + 1
    hot, rest = (HOT, COLD) if cold else ("", "")
    update = _update_sql_of(names, hot)
    update_rest = _update_sql_of(names, rest) if cold else None
    if len(rows) < SHARED_MIN:
        return run_rows(conn, update, width + 1, rows, update_rest)
    shared: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for row in rows:
        change = row[:width]
        same = shared.get(change)
        if same is None:
            shared[change] = [row]
        else:
            same.append(row)
    if len(shared) == len(rows):  # no two alike: nothing to share
        return run_rows(conn, update, width + 1, rows, update_rest)
    written = 0
    single: list[tuple[Any, ...]] = []
    shared_hot = _shared_sql_of(names, hot)
    shared_rest = _shared_sql_of(names, rest) if cold else None
    for change, same in shared.items():
        if len(same) >= SHARED_MIN:
            ids = [row[width] for row in same]
            head = (*change[:-1], BLOB(change[-1]))  # the patch, once per statement
            written += run_keys(conn, shared_hot, width, head, ids, shared_rest)
        else:
            single += same
    if single:
        written += run_rows(conn, update, width + 1, single, update_rest)
    return written


def write_groups(
    conn: sqlite3.Connection,
    groups: Iterable[Group | None],
    updates: Updates,
    cold: int,
) -> int:
    """Write the stored rows that take one change each (`add_update`'s groups): the groups
    with equal changes joined, those of `SHARED_MIN` rows or more as one statement naming
    their ids (`run_keys`), the rest added to `updates` as rows of their own,
    `(*values, patch, id)`, for `write_updates`. Returns the rows written."""
    same: dict[tuple[tuple[str, ...], tuple[Any, ...]], list[str]] = {}
    for group in groups:
        if group is None or not group[2]:
            continue
        names, head, ids = group
        key = (names, head)
        pooled = same.get(key)
        if pooled is None:
            same[key] = ids
        else:
            pooled += ids
    written = 0
    for (names, head), ids in same.items():
        if len(ids) < SHARED_MIN:
            rows = updates.get(names)
            if rows is None:
                rows = updates[names] = []
            rows += [(*head, job_id) for job_id in ids]
            continue
        hot, rest = (HOT, COLD) if cold else ("", "")
        shared_rest = _shared_sql_of(names, rest) if cold else None
        params = (*head[:-1], BLOB(head[-1]))  # the patch, once per statement
        written += run_keys(conn, _shared_sql_of(names, hot), len(head), params, ids, shared_rest)
    return written


def _update_sql_of(names: tuple[str, ...], cold: str) -> str:
    key = (names, cold)
    return _UPDATE_SQL.get(key) or _UPDATE_SQL.setdefault(key, _update_sql(names, cold))


def _shared_sql_of(names: tuple[str, ...], cold: str) -> str:
    key = (names, cold)
    return _SHARED_SQL.get(key) or _SHARED_SQL.setdefault(key, _shared_sql(names, cold))
