"""The cold backlog's reads: pages of a queue in delivery order, lookups, counts.

A shard under a memory budget keeps each queue's head in memory and leaves the rest in
storage. These reads are what it pages in with and what its lookups of cold jobs go to. They
see the cold rows only, the jobs the engine marked cold (`_cold`): a hot row is the engine's
to know, and is in none of their indexes. Every one runs on an index made for it
(`_schema._v9_cold_backlog`, `_pg_schema._v6_cold_backlog`) and is bounded: a page by `limit`
rows and about `max_bytes` of stored record bytes, read from the database in chunks of at
most `CHUNK` rows.

The order is exactly the engine's (`shardq.core._queue`, `_groups`, `_state`):

- waiting ungrouped jobs: higher priority first; within a priority LIFO jobs first, newest
  (highest seq) first; then FIFO jobs by run_at, then seq. The cursor is
  `(-priority, -lifo, -seq if lifo else run_at, seq, row key)`.
- waiting jobs of one group: lower priority first, then run_at, then seq. The cursor is
  `(priority, run_at, seq, row key)`.
- delayed jobs: by run_at, then seq. The cursor is `(run_at, seq, row key)`.

A missing priority or run_at counts as 0, as the engine reads it. The last tie-break is the
row key (the job id, or for a job with a custom id that id with its queue) where the engine's
heaps end with the job id; within one shard no two jobs share a seq, so it never decides.

A page's records are what `get_job` returns: `rec` with the row's `patch` merged in and its
`delta` rows applied. The columns a page is ordered by are kept current by every update (the
writer sets them with the change, `_cold` says how for the cold ones), so a job whose row
holds a patch sorts by its merged state, the same as a job whose record was just put.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from shardq.core._mutations import ROW_KEY_SEP, Record
from shardq.storage import _cold_count_table
from shardq.storage._drain_bounds import Range, past, past_params

__all__ = [
    "CHUNK",
    "COLD_BACKLOG",
    "DEFAULT_MAX_BYTES",
    "HOT_SET",
    "KINDS",
    "MAX_LIMIT",
    "ColdCounts",
    "ColdPage",
    "ColdReads",
    "Cursor",
    "count_over_indexes_sql",
    "delayed_cursor",
    "group_cursor",
    "over_indexes_counts",
    "waiting_cursor",
]

Cursor = tuple[Any, ...]

HOT_SET: Final = "(cold IS NULL OR state NOT IN ('waiting', 'delayed'))"
"""The rows a shard under a memory budget loads when it starts (`load_jobs(hot_only=True)`):
every row but the cold waiting and delayed ones, which it pages in."""
DEFAULT_MAX_BYTES: Final = 4 << 20
"""Stored bytes (record and patch) of one page unless the caller says otherwise."""
MAX_LIMIT: Final = 100_000
"""The most rows one page may ask for."""
CHUNK: Final = 500
"""Rows per database read inside one page: a page stops within one chunk of its bounds."""

# The key expressions, as the indexes of both backends name them: a query must repeat an
# index's expressions exactly for the database to read that index in order.
_WAITING_KEY = (
    "(-coalesce(priority, 0))",
    "(-lifo)",
    "(CASE WHEN lifo = 1 THEN -seq ELSE coalesce(run_at, 0) END)",
    "seq",
)
_GROUP_KEY = ("(coalesce(priority, 0))", "(coalesce(run_at, 0))", "seq")
_DELAYED_KEY = ("(coalesce(run_at, 0))", "seq")
_MADE_KEY = ("made", "seq")
_SEQ_KEY = ("seq",)
COLD_BACKLOG: Final = "cold = 1 AND state IN ('waiting', 'delayed')"
"""The condition of the queue-wide indexes (`_schema.COLD_BACKLOG`), repeated by their reads."""
KINDS: Final[dict[str, str]] = {
    "waiting": "(state = 'waiting' AND gid IS NULL AND coalesce(priority, 0) <= 0)",
    "prioritized": "(state = 'waiting' AND gid IS NULL AND coalesce(priority, 0) > 0)",
    "delayed": "state = 'delayed'",
}
"""The public states of the queue-wide reads: the cold rows of each (GetJobs' `state`)."""


def _kinds(kinds: Collection[str]) -> str:
    unknown = set(kinds) - KINDS.keys()
    if unknown or not kinds:
        raise ValueError(f"kinds must be some of {sorted(KINDS)}, got {sorted(kinds)}")
    return " OR ".join(KINDS[k] for k in sorted(set(kinds)))


@dataclass(frozen=True)
class Dialect:
    """What the SQL of these reads differs in between the backends."""

    mark: str
    """The parameter placeholder."""
    row_id: str
    """The row key as the indexes order it (PostgreSQL: in the "C" collation, code point
    order as Python compares strings; SQLite compares UTF-8 bytes, the same order)."""
    index_prefix: str | None
    """SQLite's: each read names its index (`INDEXED BY`), so that no statistics can ever
    turn a page-in into a sort of the queue (and a dropped index fails loudly). PostgreSQL
    has no such clause; a page's ORDER BY and LIMIT make its planner take the index."""

    def jobs(self, index: str) -> str:
        """The `jobs` table, as a read over the cold index `index` names it."""
        if self.index_prefix is None:
            return "jobs"
        return f"jobs INDEXED BY {self.index_prefix}{index}"


SQLITE: Final = Dialect(mark="?", row_id="id", index_prefix="idx_jobs_")
POSTGRES: Final = Dialect(mark="%s", row_id='id COLLATE "C"', index_prefix=None)


@dataclass(frozen=True)
class ColdPage:
    """One page of cold jobs: their records in order, and the cursor to read on after."""

    records: list[Record]
    after: Cursor | None
    """The cursor of the last record (pass it for the next page); None if the page is empty."""
    done: bool
    """True if no job comes after this page (when it was read)."""


@dataclass(frozen=True)
class ColdCounts:
    """The stored waiting and delayed jobs of one queue, in total and per group."""

    waiting: int = 0
    delayed: int = 0
    group_waiting: dict[str, int] = field(default_factory=dict)
    group_delayed: dict[str, int] = field(default_factory=dict)
    prioritized: int = 0
    """Of `waiting`, the ungrouped jobs with a priority above 0 (GetJobCounts' `prioritized`)."""


def waiting_cursor(rec: Record) -> Cursor:
    """The waiting-order cursor of a job record (the last one a shard paged in or holds)."""
    seq, run_at, lifo = int(rec["seq"]), rec.get("runAt") or 0, 1 if rec.get("lifo") else 0
    return (-(rec.get("priority") or 0), -lifo, -seq if lifo else run_at, seq, _key(rec))


def group_cursor(rec: Record) -> Cursor:
    """The in-group cursor of a grouped job record."""
    return (rec.get("priority") or 0, rec.get("runAt") or 0, int(rec["seq"]), _key(rec))


def delayed_cursor(rec: Record) -> Cursor:
    """The delayed-order cursor of a job record."""
    return (rec.get("runAt") or 0, int(rec["seq"]), _key(rec))


def _key(rec: Record) -> str:
    return str(rec.get("rowKey") or rec["id"])


class ColdReads(ABC):
    """The reads of the cold backlog, for a store class that implements the three abstract
    methods below and sets its `_COLD_DIALECT`."""

    _COLD_DIALECT: Dialect = SQLITE
    cold_rows_read: int = 0
    """Rows the pages have read from the database since the store opened (every cold index
    read by a page counts): what a test bounds to show a read costs its page, not the
    backlog."""
    _counts_table: bool = False
    """Whether the schema keeps the cold counts in their table (`_cold_count_table`)."""
    _drain_table: bool = False
    """Whether the schema records the Drain ranges not deleted yet (`_drain_pending`)."""

    def drain_floor(self, queue: str) -> Range | None:
        """The seq bounds of `queue`'s Drain range still being deleted (None: none). Its
        rows, the cold waiting and delayed ones of a seq in it, are gone for every read."""
        if not self._drain_table:
            return None
        sql = f"SELECT above, seq FROM drain_pending WHERE queue = {self._COLD_DIALECT.mark}"
        rows = self._cold_rows("reading the pending drains", sql, (queue,))
        if not rows:
            return None
        above, seq = rows[0]
        return (None if above is None else int(above), int(seq))

    def _past_floor(self, queue: str, where: str, params: tuple[Any, ...]) -> tuple[str, Any]:
        """`where` and `params` of a read of `queue`'s cold waiting or delayed rows, leaving
        out its pending Drain range (`drain_floor`), if any."""
        floor = self.drain_floor(queue)
        if floor is None:
            return where, params
        # `+seq`: a filter on the index's entries, never a range of it (a second range on
        # seq beside a cursor's made SQLite sort the page instead of reading it in order).
        return f"{where} AND {past(floor, '+seq')}", (*params, *past_params(floor))

    def page_waiting(
        self,
        queue: str,
        after: Cursor | None = None,
        *,
        limit: int,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> ColdPage:
        """The next ungrouped cold waiting jobs of `queue` in delivery order, strictly after
        `after` (None: from the head). Raises `ValueError` for a bound out of range or a
        cursor of the wrong length, `StorageError` if the read fails."""
        where, params = self._past_floor(
            queue, "queue = {m} AND cold = 1 AND state = 'waiting' AND gid IS NULL", (queue,)
        )
        return self._cold_page(_WAITING_KEY, "waiting", where, params, after, limit, max_bytes)

    def page_group(
        self,
        queue: str,
        group: str,
        after: Cursor | None = None,
        *,
        limit: int,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> ColdPage:
        """The next cold waiting jobs of one group of `queue`, in the group's order (as
        `page_waiting`)."""
        where = "queue = {m} AND gid = {m} AND cold = 1 AND state = 'waiting' AND gid IS NOT NULL"
        where, params = self._past_floor(queue, where, (queue, group))
        return self._cold_page(_GROUP_KEY, "group_waiting", where, params, after, limit, max_bytes)

    def page_delayed(
        self,
        queue: str,
        after: Cursor | None = None,
        *,
        limit: int,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> ColdPage:
        """The next cold delayed jobs of `queue` (grouped or not) by run time (as
        `page_waiting`)."""
        where, params = self._past_floor(queue, "queue = {m} AND cold = 1 AND state = 'delayed'",
                                         (queue,))  # fmt: skip
        return self._cold_page(_DELAYED_KEY, "delayed", where, params, after, limit, max_bytes)

    def page_made(
        self,
        queue: str,
        kinds: Collection[str],
        after: Cursor | None = None,
        *,
        limit: int,
        desc: bool = False,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> ColdPage:
        """The next cold jobs of `queue` of the public states `kinds` ("waiting",
        "prioritized": ungrouped waiting jobs without and with a priority; "delayed") in
        GetJobs' order: created at, then seq, then row key; `desc` reverses it. The cursor is
        `(created at, seq, row key)`. Reads `limit` rows, not the backlog (`_v11_cold_made`)."""
        where = f"queue = {{m}} AND {COLD_BACKLOG} AND ({_kinds(kinds)})"
        where, params = self._past_floor(queue, where, (queue,))
        return self._cold_page(_MADE_KEY, "cold_made", where, params, after, limit, max_bytes, desc)

    def page_by_seq(
        self,
        queue: str,
        kinds: Collection[str],
        after: Cursor | None = None,
        *,
        limit: int,
        made_by: int | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> ColdPage:
        """The next cold jobs of `queue` of the public states `kinds` (as `page_made`) by seq,
        then row key (Clean's order), created at or before `made_by` if given. The cursor is
        `(seq, row key)`. A row created after `made_by` is skipped in the index (its columns
        hold `made`), never read from the table."""
        where = f"queue = {{m}} AND {COLD_BACKLOG} AND ({_kinds(kinds)})"
        params: tuple[Any, ...] = (queue,)
        if made_by is not None:
            where += " AND made <= {m}"
            params = (queue, made_by)
        where, params = self._past_floor(queue, where, params)
        return self._cold_page(_SEQ_KEY, "cold_by_seq", where, params, after, limit, max_bytes)

    def cold_keys(
        self, queue: str, after: Cursor | None = None, *, limit: int
    ) -> list[tuple[int, str, str | None]]:
        """The next cold ungrouped waiting and cold delayed jobs of `queue` by seq, then row
        key, strictly after `after` (`(seq, row key)`), as (seq, row key, uniqueKey): Drain's
        read, which removes them by key. No record is read or decoded: a few microseconds of
        the database's own time a job, where a page decodes each record."""
        _check_limit(limit)
        d = self._COLD_DIALECT
        where = f"queue = {{m}} AND {COLD_BACKLOG} AND ({_kinds(KINDS)})"
        where, params = self._past_floor(queue, where, (queue,))
        where = where.format(m=d.mark)
        select = f"SELECT seq, {d.row_id}, ukey FROM {d.jobs('cold_by_seq')} WHERE {where}"
        rows = self._rows_after(select, ("seq", d.row_id), params, after, limit)
        self.cold_rows_read += len(rows)
        return [(int(seq), str(key), ukey) for seq, key, ukey in rows]

    def get_by_custom_id(self, queue: str, custom_id: str) -> Record | None:
        """The cold job of `queue` pushed with this custom id, or None (also for a hot one):
        its row key is the id joined to its queue, so this is one primary-key read."""
        key: tuple[Any, ...] = (f"{custom_id}{ROW_KEY_SEP}{queue}",)
        where, key = self._not_drained(queue, "id = {m} AND cold = 1", key)
        rows = self._read_records("jobs", where, key, 1)
        return rows[0] if rows else None

    def find_unique(self, queue: str, unique_key: str, *, limit: int = 16) -> list[Record]:
        """The cold jobs of `queue` with this uniqueKey, in any state, oldest (lowest seq)
        first, at most `limit`: the caller decides which of them still holds the key."""
        _check_limit(limit)
        where, params = self._not_drained(queue, "queue = {m} AND ukey = {m} AND cold = 1",
                                          (queue, unique_key))  # fmt: skip
        table = self._COLD_DIALECT.jobs("unique")
        where = f"{where} ORDER BY seq LIMIT {{m}}"
        return self._read_records(table, where, (*params, limit), limit)

    def _not_drained(self, queue: str, where: str, params: tuple[Any, ...]) -> tuple[str, Any]:
        """`_past_floor` for a read of cold rows in any state: only the waiting and delayed
        ones are in a Drain's range."""
        floor = self.drain_floor(queue)
        if floor is None:
            return where, params
        spared = f"({past(floor)} OR state NOT IN ('waiting', 'delayed'))"
        return f"{where} AND {spared}", (*params, *past_params(floor))

    def cold_counts(self, queue: str) -> ColdCounts:
        """The cold waiting and delayed jobs of `queue`, per group too, and the ungrouped
        waiting ones with a priority. From the `cold_counts` table (`_cold_count_table`: a
        few rows, whatever the backlog) where the schema has it, else counted over the paging
        indexes (no record is read, but one entry per cold job). A queue whose Drain range
        is still being deleted counts only its rows above it, over the index by seq (the
        jobs pushed after the Drain: `_drain_pending`)."""
        m = self._COLD_DIALECT.mark
        action = f"counting the cold jobs of queue {queue!r}"
        floor = self.drain_floor(queue)
        if floor is not None:
            sql = _cold_count_table.count_after(self._COLD_DIALECT, past(floor))
            rows = self._cold_rows(action, sql, (queue, *past_params(floor)))
            totals, groups = _cold_count_table.to_counts(rows)
        elif self._counts_table:
            rows = self._cold_rows(action, _cold_count_table.read_counts(m), (queue,))
            totals, groups = _cold_count_table.to_counts(rows)
        else:
            totals, groups = self._count_over_indexes(action, queue)
        return ColdCounts(
            totals["waiting"],
            totals["delayed"],
            groups["waiting"],
            groups["delayed"],
            totals["prioritized"],
        )

    def _count_over_indexes(
        self, action: str, queue: str
    ) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        """`cold_counts` of a schema without the table: one read per paging index."""
        sql = count_over_indexes_sql(self._COLD_DIALECT)
        return over_indexes_counts(self._cold_rows(action, sql, (queue,) * 4))

    def cold_priorities(self, queue: str) -> dict[int | float, int]:
        """The cold ungrouped waiting and the cold delayed jobs of `queue`, counted by
        priority (GetCountsPerPriority): a GROUP BY over the paging indexes, which holds the
        waiting jobs' priority; the delayed jobs' is read from their rows (no record is
        decoded). A priority that is a whole number comes back as an int."""
        d = self._COLD_DIALECT
        m = d.mark
        floor = self.drain_floor(queue)
        # Not its pending Drain range.
        outside = "" if floor is None else " AND " + past(floor).format(m=m)
        sql = (
            f"SELECT {_WAITING_KEY[0]}, count(*) FROM {d.jobs('waiting')}"
            f" WHERE queue = {m} AND cold = 1 AND state = 'waiting' AND gid IS NULL{outside}"
            f" GROUP BY {_WAITING_KEY[0]}"
            f" UNION ALL SELECT -coalesce(priority, 0), count(*) FROM {d.jobs('delayed')}"
            f" WHERE queue = {m} AND cold = 1 AND state = 'delayed'{outside}"
            " GROUP BY -coalesce(priority, 0)"
        )
        bounds = () if floor is None else past_params(floor)
        params = (queue, *bounds, queue, *bounds)
        out: dict[int | float, int] = {}
        action = f"counting the cold jobs of queue {queue!r} by priority"
        for negated, n in self._cold_rows(action, sql, params):
            value = -float(negated)
            key: int | float = int(value) if value.is_integer() else value
            out[key] = out.get(key, 0) + int(n)
        return out

    # -- shared ----------------------------------------------------------------------------

    def _cold_page(
        self,
        key: Sequence[str],
        index: str,
        where: str,
        params: tuple[Any, ...],
        after: Cursor | None,
        limit: int,
        max_bytes: int,
        desc: bool = False,
    ) -> ColdPage:
        _check_limit(limit)
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        width = len(key) + 1
        if after is not None and len(after) != width:
            raise ValueError(f"a cursor of this order has {width} values, got {len(after)}")
        d = self._COLD_DIALECT
        columns = (*key, d.row_id)
        base = f"SELECT {', '.join(columns)}, rec, patch, id FROM {d.jobs(index)} WHERE"
        select = f"{base} {where.format(m=d.mark)}"
        rows: list[Any] = []
        size, cursor, done = 0, after, False
        while True:
            chunk = min(CHUNK, limit - len(rows))
            got = self._rows_after(select, columns, params, cursor, chunk, desc)
            self.cold_rows_read += len(got)
            for row in got:
                rows.append(row)
                size += len(row[width]) + len(row[width + 1])
                if size >= max_bytes:
                    break
            if got and rows[-1] is not got[-1]:
                break  # stopped by its bytes inside a chunk: more follow
            if len(got) < chunk:
                done = True
                break
            if len(rows) >= limit or size >= max_bytes:
                break
            cursor = tuple(rows[-1][:width])
        records = self._assemble(rows, width)
        return ColdPage(records, tuple(rows[-1][:width]) if rows else None, done)

    def _rows_after(
        self,
        select: str,
        columns: Sequence[str],
        params: tuple[Any, ...],
        cursor: Cursor | None,
        count: int,
        desc: bool = False,
    ) -> list[Any]:
        """Up to `count` rows in order strictly after `cursor` (`desc`: in reverse order,
        strictly before it).

        "After (k1, ..., kn)" is read as n ranges, each the rows equal to the cursor on a
        prefix of the key and greater on the next column, from the longest prefix to the
        shortest: their rows follow each other in the order, and each range is one seek in
        the index. (SQLite does not seek an index of expressions on a row-value comparison:
        `(k1, ..., kn) > (...)` scanned the queue from its head, so a page in the middle of a
        million jobs read half of them.) Each range is ordered by the columns after its
        prefix only: the prefix is constant in it, and SQLite sorts a range ordered by an
        expression it holds equal instead of reading the index in order."""
        action = "paging cold jobs in"
        mark = self._COLD_DIALECT.mark
        way, beyond = (" DESC", "<") if desc else ("", ">")
        if cursor is None:
            sql = f"{select} ORDER BY {', '.join(c + way for c in columns)} LIMIT {mark}"
            return self._cold_rows(action, sql, (*params, count))
        rows: list[Any] = []
        for depth in range(len(columns) - 1, -1, -1):
            terms = [f"{column} = {mark}" for column in columns[:depth]]
            terms.append(f"{columns[depth]} {beyond} {mark}")
            order = ", ".join(c + way for c in columns[depth:])
            sql = f"{select} AND {' AND '.join(terms)} ORDER BY {order} LIMIT {mark}"
            bound = (*params, *cursor[: depth + 1], count - len(rows))
            rows.extend(self._cold_rows(action, sql, bound))
            if len(rows) >= count:
                break
        return rows

    def _assemble(self, rows: list[Any], width: int) -> list[Record]:
        ops = self._cold_ops([row[width + 2] for row in rows]) if rows else {}
        return [
            self._decode_row(row[width], row[width + 1], ops.get(row[width + 2], ()))
            for row in rows
        ]

    def _read_records(
        self, table: str, where: str, params: tuple[Any, ...], limit: int
    ) -> list[Record]:
        sql = f"SELECT rec, patch, id FROM {table} WHERE {where.format(m=self._COLD_DIALECT.mark)}"
        rows = self._cold_rows("looking up cold jobs", sql, params)[:limit]
        return self._assemble(rows, 0)

    # -- the store's part -----------------------------------------------------------------

    @abstractmethod
    def _cold_rows(self, action: str, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """Every row of one read. Raises `StorageError` (naming `action`) if it fails."""

    @abstractmethod
    def _cold_ops(self, job_ids: list[str]) -> dict[str, list[bytes]]:
        """The encoded delta ops of each of `job_ids` that has any, in order. Always read:
        a shard's reading store cannot know what the writer appended since it opened."""

    @abstractmethod
    def _decode_row(self, rec: bytes, patch: bytes, ops: Iterable[bytes] = ()) -> Record:
        """A stored job's record (`_write.merge_row`). Raises `StorageError` if corrupt."""


def count_over_indexes_sql(d: Dialect) -> str:
    """One queue's cold counts over the paging indexes alone (no row read, one index entry
    per cold job), its queue parameter four times: ('waiting', NULL, ungrouped waiting),
    ('prioritized', NULL, those with a priority above 0), ('waiting', gid, n) per group,
    ('delayed', gid or NULL, n)."""
    m = d.mark
    return (
        f"SELECT 'waiting', NULL, count(*) FROM {d.jobs('waiting')}"
        f" WHERE queue = {m} AND cold = 1 AND state = 'waiting' AND gid IS NULL"
        f" UNION ALL SELECT 'prioritized', NULL, count(*) FROM {d.jobs('waiting')}"
        f" WHERE queue = {m} AND cold = 1 AND state = 'waiting' AND gid IS NULL"
        f" AND {_WAITING_KEY[0]} < 0"
        f" UNION ALL SELECT 'waiting', gid, count(*) FROM {d.jobs('group_waiting')}"
        f" WHERE queue = {m} AND cold = 1 AND state = 'waiting' AND gid IS NOT NULL"
        " GROUP BY gid"
        f" UNION ALL SELECT 'delayed', gid, count(*) FROM {d.jobs('delayed')}"
        f" WHERE queue = {m} AND cold = 1 AND state = 'delayed' GROUP BY gid"
    )


def over_indexes_counts(
    rows: Iterable[Sequence[Any]],
) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """The rows of `count_over_indexes_sql` as totals (waiting, delayed, prioritized) and
    per-group counts (waiting, delayed)."""
    totals = {"waiting": 0, "delayed": 0, "prioritized": 0}
    groups: dict[str, dict[str, int]] = {"waiting": {}, "delayed": {}}
    for state, gid, n in rows:
        totals[state] += int(n)
        if gid is not None:
            groups[state][gid] = int(n)
    return totals, groups


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be from 1 to {MAX_LIMIT}, got {limit}")
