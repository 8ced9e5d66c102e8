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
    conn: sqlite3.Connection,
    template: str,
    width: int,
    rows: Sequence[Sequence[Any]],
    rest: str | None = None,
) -> int:
    """Run `template` over `rows` (each of `width` values) and return the rows it changed.
    `template` holds `{rows}` where its rows go, as `(?, ...), (?, ...)`. `rest`: a template
    run over the same rows as well where `template` changed fewer rows than it was given
    (`template` skips the rows it must not touch, `rest` takes them: `_write`'s hot and
    cold updates)."""
    written = 0
    pos, count = 0, len(rows)
    for size in SIZES:
        if count - pos < size:
            continue
        sql = _sql(template, width, size)
        while count - pos >= size:
            params = list(chain.from_iterable(rows[pos : pos + size]))
            changed = conn.execute(sql, params).rowcount
            if rest is not None and changed < size:
                changed += conn.execute(_sql(rest, width, size), params).rowcount
            written += changed
            pos += size
    return written


def _sql(template: str, width: int, size: int) -> str:
    key = (template, width, size)
    sql = _SQL.get(key)
    if sql is None:
        one = f"({', '.join('?' * width)})"
        sql = _SQL[key] = template.format(rows=", ".join([one] * size))
    return sql


def run_keys(
    conn: sqlite3.Connection,
    template: str,
    width: int,
    head: Sequence[Any],
    keys: Sequence[str],
    rest: str | None = None,
) -> int:
    """Run `template` once per slice of `keys` and return the rows it changed: `head` (its
    `width` values) bound first, then the keys. `template` holds `{rows}` where the keys go,
    as `?, ?, ...`, in slices of `SIZES` like `run_rows` (so its texts are few and cached).
    `rest`: as in `run_rows`, run over a slice whose rows `template` did not all change.

    For rows that all take the same values (jobs leased or acknowledged together share one
    change, `updm`): SQLite finds each row by key and evaluates the values once per statement,
    where `run_rows` joins a VALUES table of the same values repeated per row.
    """
    written = 0
    pos, count = 0, len(keys)
    head = list(head)
    while pos < count:
        take = min(count - pos, SIZES[0])
        size = _PADDED[take]
        part = list(keys[pos : pos + take])
        if size > take:
            part += [part[-1]] * (size - take)
        params = head + part
        changed = conn.execute(_key_sql(template, width, size), params).rowcount
        if rest is not None and changed < take:
            changed += conn.execute(_key_sql(rest, width, size), params).rowcount
        written += changed
        pos += take
    return written


# The statement size `run_keys` takes for n keys: the smallest power of two from 1 to 256
# that holds them, the rest of it filled with the last key again.
_PADDED: Final = [0] + [1 << (n - 1).bit_length() for n in range(1, SIZES[0] + 1)]


def _key_sql(template: str, width: int, size: int) -> str:
    key = (template, -width, size)
    sql = _SQL.get(key)
    if sql is None:
        sql = _SQL[key] = template.format(rows=", ".join("?" * size))
    return sql
