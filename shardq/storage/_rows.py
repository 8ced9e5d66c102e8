"""The writer's statements over many job rows at once (SQLite).

`executemany` runs its statement once per row, and every run opens a cursor on the table and
on each index the statement may change, then closes them: on a put, one per index of the
table, whether or not the row has an entry in it (a partial index is checked row by row). A
statement whose VALUES list many rows opens them once for all of its rows. With the cold
backlog's four partial indexes (`_cold`), which a hot row never enters, those cursors were
most of what they cost a hot push (bench/results/2026-12-04-coldflag.md); written this way,
a batch pays them once per statement.

A batch's rows go in statements of `SIZES` rows (the largest that fits first), so each
statement's text is one of a few, parsed once and kept by the connection's statement cache,
and each stays far below SQLite's limit of bound values.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from itertools import chain
from typing import Any, Final

__all__ = ["SHARED_MIN", "SIZES", "run_keys", "run_rows"]

SIZES: Final = (256, 64, 16, 4, 1)
"""Rows per statement: a batch of n rows takes at most n // 256 + 9 statements."""

SHARED_MIN: Final = 4
"""Rows that must share one change for `run_keys` to write them (fewer go by `run_rows`)."""

_SQL: dict[tuple[str, int, int], str] = {}


def run_rows(
    conn: sqlite3.Connection, template: str, width: int, rows: Sequence[Sequence[Any]]
) -> int:
    """Run `template` over `rows` (each of `width` values) and return the rows it changed.
    `template` holds `{rows}` where its rows go, as `(?, ...), (?, ...)`."""
    written = 0
    pos, count = 0, len(rows)
    for size in SIZES:
        if count - pos < size:
            continue
        key = (template, width, size)
        sql = _SQL.get(key)
        if sql is None:
            one = f"({', '.join('?' * width)})"
            sql = _SQL[key] = template.format(rows=", ".join([one] * size))
        while count - pos >= size:
            params = list(chain.from_iterable(rows[pos : pos + size]))
            written += conn.execute(sql, params).rowcount
            pos += size
    return written


def run_keys(
    conn: sqlite3.Connection, template: str, width: int, head: Sequence[Any], keys: Sequence[str]
) -> int:
    """Run `template` once per slice of `keys` and return the rows it changed: `head` (its
    `width` values) bound first, then the keys. `template` holds `{rows}` where the keys go,
    as `?, ?, ...`, in slices of `SIZES` like `run_rows` (so its texts are few and cached).

    For rows that all take the same values (jobs leased or acknowledged together share one
    change, `updm`): SQLite finds each row by key and evaluates the values once per statement,
    where `run_rows` joins a VALUES table of the same values repeated per row.
    """
    written = 0
    pos, count = 0, len(keys)
    head = list(head)
    for size in SIZES:
        if count - pos < size:
            continue
        key = (template, -width, size)
        sql = _SQL.get(key)
        if sql is None:
            sql = _SQL[key] = template.format(rows=", ".join("?" * size))
        while count - pos >= size:
            written += conn.execute(sql, head + list(keys[pos : pos + size])).rowcount
            pos += size
    return written
