"""A start's reads in seq order over the split seq index (`_schema._v10_seq_by_temperature`).

From schema version `SEQ_VERSION` on, a row's seq is in exactly one of three partial indexes
(`_schema.SEQ_INDEXES`): the rows never marked cold, the cold backlog (cold rows waiting or
delayed) and the cold rows taken since. A read in seq order reads the indexes it needs, each
in order and bounded by the page's LIMIT, and SQLite merges the few rows they return: the
hot set (`load_jobs(hot_only=True)`) and the completed window (`completed_floor`) never walk
the backlog, however large it is. Each part names its index (`INDEXED BY`) and repeats its
condition, so that no statistics can turn it into a walk of another (and a dropped index
fails loudly).

Below `SEQ_VERSION` (a store opened at an older version, as tests do) one index holds every
row's seq and these reads are the single walks of `_store`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from shardq.storage._schema import HOT_SEQ_INDEXES, SEQ_INDEXES

__all__ = ["FIRST", "completed_floor_sql", "max_seq_sql", "page_params", "page_sql", "parts"]

FIRST: Final = (-(1 << 63), 0)
"""The cursor (seq, rowid) before every row: the first page reads from it."""


def parts(hot_only: bool) -> tuple[str, ...]:
    """The seq indexes a load reads: the hot set's, or all three."""
    return HOT_SEQ_INDEXES if hot_only else tuple(SEQ_INDEXES)


def page_sql(where: str, indexes: Sequence[str]) -> str:
    """One page of rows (seq, rowid, rec, patch, id) after a cursor, in (seq, rowid) order,
    from `indexes`: each part reads at most the page's rows from its own index."""
    one = (
        "SELECT * FROM (SELECT seq, rowid AS r, rec, patch, id FROM jobs INDEXED BY {ix}"
        " WHERE {cond} AND (seq, rowid) > (?, ?) AND {where} ORDER BY seq, rowid LIMIT ?)"
    )
    union = " UNION ALL ".join(
        one.format(ix=ix, cond=SEQ_INDEXES[ix], where=where) for ix in indexes
    )
    return f"{union} ORDER BY 1, 2 LIMIT ?"


def page_params(
    cursor: tuple[int, int], params: tuple[Any, ...], limit: int, indexes: Sequence[str]
) -> tuple[Any, ...]:
    """The parameters of `page_sql`: each part's cursor, filter and limit, then the limit."""
    return (*[v for _ in indexes for v in (*cursor, *params, limit)], limit)


def completed_floor_sql(where: str) -> str:
    """The seq of the `keep`-th newest completed row (0-based, the OFFSET): each part reads
    at most `keep + 1` completed rows from its index, newest first. Completed rows are never
    in the backlog's index. Parameters: per hot index (*filter, keep + 1), then keep."""
    one = (
        "SELECT * FROM (SELECT seq FROM jobs INDEXED BY {ix} WHERE {cond}"
        " AND state = 'completed' AND {where} ORDER BY seq DESC LIMIT ?)"
    )
    union = " UNION ALL ".join(
        one.format(ix=ix, cond=SEQ_INDEXES[ix], where=where) for ix in HOT_SEQ_INDEXES
    )
    return f"{union} ORDER BY 1 DESC LIMIT 1 OFFSET ?"


def max_seq_sql() -> str:
    """The highest seq of any row (NULL if none): the last entry of each seq index."""
    one = "SELECT (SELECT seq FROM jobs INDEXED BY {ix} WHERE {cond} ORDER BY seq DESC LIMIT 1)"
    parts = " UNION ALL ".join(one.format(ix=ix, cond=c) for ix, c in SEQ_INDEXES.items())
    return f"SELECT max(s) FROM ({parts.replace(')', ') AS s', 1)})"
