"""A lone durable push's write: a batch that is one encoded put of a hot record.

The writer commits a durable push's batch at once, alone (`runtime.writer._flush`), so on a
durable single push every commit is one `putb`. `Store.apply` would coalesce it into a
`Plan`, walk `write_plan` over it and remember the plan's rows: about 60 Python calls for
what ends as one upsert. `lone_put` recognises the batch and returns that upsert's row, the
very tuple `_write._write_jobs` builds for a hot put (the same checks, the same statement
text, so the same stored row); `Store` runs it in autocommit mode, which commits it as
BEGIN IMMEDIATE ... COMMIT would (the same lock, WAL frames and sync) and rolls it back
whole if it fails. Any other batch, and a put that is malformed or cold, returns None and
takes the general path, which reports what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from shardq.core._mutations import Mutation
from shardq.storage._coalesce import Plan, Stored
from shardq.storage._write_puts import _NO_PATCH, _UPSERT_JOB, _UPSERT_PLAIN_JOB, HOT_ROW
from shardq.storage._write_updates import BLOB

__all__ = ["NO_PLAN", "lone_known", "lone_put", "lone_sql"]

_ONE_ROW = f"({', '.join('?' * HOT_ROW)})"  # `_rows._sql`'s text for one row: one cached statement
_UPSERT: Final = _UPSERT_JOB.format(rows=_ONE_ROW)
_UPSERT_PLAIN: Final = _UPSERT_PLAIN_JOB.format(rows=_ONE_ROW)
_PUT_FIELDS: Final = 8  # "putb", id, queue, state, priority, run_at, seq, rec (`_encode`)

NO_PLAN: Final = Plan()
"""The plan `Store.settle` remembers a lone put's row under: nothing obliterated."""


def lone_sql(cold: int) -> str:
    """The upsert of one hot row on a jobs table with `cold` cold columns
    (`_write_puts._write_whole`)."""
    return _UPSERT if cold else _UPSERT_PLAIN


def lone_put(mutations: Sequence[Mutation]) -> tuple[Any, ...] | None:
    """The upsert's parameters if `mutations` is one encoded put of a hot record whose
    column fields the general path would take as they are (`_write_jobs`); else None."""
    if len(mutations) != 1:
        return None
    m: Any = mutations[0]  # as it came off the wire: anything
    if (type(m) is not list and type(m) is not tuple) or len(m) != _PUT_FIELDS:
        return None
    kind, key, queue, state, priority, run_at, seq, rec = m
    if (
        kind == "putb"
        and type(key) is str
        and type(rec) is bytes
        and type(queue) is str
        and type(state) is str
        and type(seq) is int
    ):
        return (key, queue, state, priority, run_at, seq, BLOB(rec), _NO_PATCH)
    return None


def lone_known(row: tuple[Any, ...]) -> dict[str, Stored | None]:
    """What the store learns of the job once `row` is written (`_write_jobs`'s `known`)."""
    return {row[0]: (row[1], len(row[6]), 0, 0)}
