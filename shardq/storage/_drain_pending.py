"""A Drain's range deleted in pieces after its commit: the pending ranges (both backends).

A `qdrain` of a million cold rows deleted inside its batch's transaction held the writer for
the whole deletion (8.6 s of CPU, 20-50 s at load): no other batch of any shard committed
meanwhile. From `_schema.DRAIN_VERSION` on, the batch holding the `qdrain` only records the
range, `(queue, seq)`, in the table `drain_pending` (one row per queue; a second Drain of the
queue raises its seq, or, not above the range's lower bound, deletes at once: `record`) and
commits at once. Its rows are the queue's cold waiting and delayed
ones of seq up to `seq` and above `above` (NULL, none, until rows are spared: below). The
writer then deletes the range's rows in pieces, each its own short transaction (`piece_top`),
between its other batches; the piece that finds the range empty deletes its row of
`drain_pending` in the same transaction.

While a range is pending its rows are still in `jobs`, and every read treats them as gone:

- the cold backlog's reads (`_cold_reads`) add "seq outside the bounds" (`_drain_bounds`)
  to their condition, which is exactly "not in the range", as those reads see only cold
  waiting and delayed rows (a lookup in any state spares the other states);
- `cold_counts` of a queue with a pending range counts the queue's cold rows outside it
  (pushed after the Drain, or spared) over the cold backlog's index by seq; the
  `cold_counts` table itself keeps counting every row present, and its triggers take each
  deleted row off as the pieces go, so it is exact again when the range is done;
- `get_job` returns None for a row in a range (the row and its range read in one statement,
  `_drain_bounds.BY_ID`); `load_jobs` leaves them out; `max_seq` is at least every
  pending seq, so a restarted shard numbers its new jobs above every range.

What the ranges cannot tell apart is a row written after the `qdrain` that lands in the range
(a job of the queue of a seq up to the bound, made cold waiting or delayed later: a retry
sent cold, a put that a resent batch re-applies). The writer checks the rows of each batch
of a queue with a pending range (`settle_before`, `settle_after`): an `upd` of a row in the
range is an update of a drained job, skipped (its row deleted, as the range would); a row
the batch leaves in the range was written after the `qdrain`, so the rest of the range is
deleted at once, in that batch's transaction, sparing the rows the batch wrote
(`finish`). That costs the old stall, but only in that rare case, which the engine avoids.

The record is durable and written in the `qdrain`'s own commit: a writer killed in the middle
of the deletion finds the range at its next open and goes on, and nothing drained is ever
visible in between.

PostgreSQL keeps the same table from its schema 11 (`_pg_schema.DRAIN_VERSION`), and runs the
same statements in its dialect (`PendingSql`: `POSTGRES_PENDING`); its pieces take the rows'
counts off `cold_counts` themselves (`_cold_count_table.pg_counted_delete`), and several nodes
share its table, each working only the ranges of the partitions it holds (`_pg_drain`).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog

from shardq.storage._coalesce import Plan
from shardq.storage._cold_count_table import PG_EMPTY_COUNTS, PG_SKIP_SETTING, pg_counted_delete
from shardq.storage._drain_bounds import Range, inside

__all__ = [
    "POSTGRES_PENDING",
    "SQLITE_PENDING",
    "Db",
    "PendingSql",
    "done",
    "finish_to",
    "load",
    "piece_top",
    "record",
    "settle_after",
    "settle_before",
]


class Db(Protocol):
    """What these functions use of a connection: sqlite3's and psycopg's both have it."""

    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...


@dataclass(frozen=True)
class PendingSql:
    """What the statements of the pending ranges differ in between the backends."""

    mark: str
    """The parameter placeholder."""
    indexed: str
    """The clause naming the cold backlog's index by seq (SQLite's `INDEXED BY`), or ''."""
    order: str
    """The row key as the index orders it."""
    greatest: str
    """The function of the larger of two values."""
    counted: bool
    """True: a piece takes its rows' counts off `cold_counts` itself (PostgreSQL, whose
    trigger would update one count row once a deleted row); else the triggers do."""

    def cold(self) -> str:
        return f"queue = {self.mark} AND cold = 1 AND state IN ('waiting', 'delayed')"


SQLITE_PENDING: Final = PendingSql("?", " INDEXED BY idx_jobs_cold_by_seq", "id", "max", False)
POSTGRES_PENDING: Final = PendingSql("%s", "", 'id COLLATE "C"', "greatest", True)

_log = structlog.get_logger("shardq.storage")


def load(conn: Db) -> dict[str, Range]:
    """The pending ranges by queue."""
    sql = "SELECT queue, above, seq FROM drain_pending"
    rows = conn.execute(sql).fetchall()
    return {q: (None if a is None else int(a), int(s)) for q, a, s in rows}


def record(
    conn: Db,
    pending: dict[str, Range],
    queue: str,
    seq: int,
    d: PendingSql = SQLITE_PENDING,
    *,
    deltas: bool,
    chunk: int,
) -> tuple[int, int]:
    """Record a `qdrain`'s range (in the caller's transaction; `pending` is updated too): a
    queue's range already pending grows to every seq up to the higher bound. Returns (rows,
    ops deleted): none, unless the range pending has spared rows (`finish_to`) and `seq` is
    not above its lower bound (`_drain_below`)."""
    above = pending[queue][0] if queue in pending else None
    if above is not None and seq <= above:
        return _drain_below(conn, queue, seq, deltas=deltas, chunk=chunk, d=d)
    m = d.mark
    conn.execute(
        f"INSERT INTO drain_pending VALUES ({m}, NULL, {m}) ON CONFLICT (queue) DO UPDATE"
        f" SET seq = {d.greatest}(drain_pending.seq, excluded.seq), above = NULL",
        (queue, seq),
    )
    pending[queue] = (None, max(seq, pending.get(queue, (None, seq))[1]))
    return 0, 0


def _drain_below(
    conn: Db, queue: str, seq: int, *, deltas: bool, chunk: int, d: PendingSql
) -> tuple[int, int]:
    """A `qdrain` of `queue` up to `seq`, not above the lower bound of its pending range: the
    rows it meets were written after that range's rows up to its bound were deleted (spared,
    or later), and rows of seq between `seq` and the bound are not its. Dropping the bound
    would put those back in the range, so its rows are deleted now and the range stays."""
    rows = ops = 0
    while True:
        got, gone, _top = piece_top(conn, queue, (None, seq), chunk, deltas=deltas, d=d)
        rows += got
        ops += gone
        if got < max(1, chunk):
            return rows, ops


def _statements(r: Range, keep: int, d: PendingSql) -> tuple[str, str]:
    m = d.mark
    lower = "" if r[0] is None else f" AND seq > {m}"
    spared = f" AND id NOT IN ({', '.join([m] * keep)})" if keep else ""
    select = (
        f"SELECT id FROM jobs{d.indexed} WHERE {d.cold()} AND seq <= {m}{lower}{spared}"
        f" ORDER BY seq, {d.order} LIMIT {m}"
    )
    rows = pg_counted_delete(select) if d.counted else f"DELETE FROM jobs WHERE id IN ({select})"
    return f"DELETE FROM job_deltas WHERE id IN ({select})", rows


def piece_top(
    conn: Db,
    queue: str,
    r: Range,
    rows: int,
    *,
    deltas: bool,
    keep: Collection[str] = (),
    d: PendingSql = SQLITE_PENDING,
) -> tuple[int, int, int | None]:
    """Delete up to `rows` rows of `queue`'s range `r`, in seq order, sparing `keep` (in the
    caller's transaction); returns (rows deleted, ops deleted, the highest seq deleted where
    the backend says: PostgreSQL's counted deletion does, None otherwise)."""
    ops_sql, rows_sql = _statements(r, len(keep), d)
    lower = () if r[0] is None else (r[0],)
    params = (queue, r[1], *lower, *keep, max(1, rows))
    ops = max(conn.execute(ops_sql, params).rowcount, 0) if deltas else 0
    if not d.counted:
        return max(conn.execute(rows_sql, params).rowcount, 0), ops, None
    # The statement counts its rows, not the trigger (`_cold_count_table`).
    conn.execute(f"SELECT set_config({d.mark}, 'on', true)", (PG_SKIP_SETTING,))
    got, top = conn.execute(rows_sql, params).fetchone()
    conn.execute(f"SELECT set_config({d.mark}, 'off', true)", (PG_SKIP_SETTING,))
    if got:
        conn.execute(PG_EMPTY_COUNTS, (queue,))
    return int(got), ops, None if top is None else int(top)


def done(conn: Db, pending: dict[str, Range], queue: str, d: PendingSql = SQLITE_PENDING) -> None:
    """The range of `queue` is deleted: forget it (in the caller's transaction)."""
    conn.execute(f"DELETE FROM drain_pending WHERE queue = {d.mark}", (queue,))
    pending.pop(queue, None)


def finish_to(
    conn: Db,
    pending: dict[str, Range],
    queue: str,
    top: int,
    *,
    deltas: bool,
    chunk: int,
    keep: Collection[str],
    d: PendingSql = SQLITE_PENDING,
) -> tuple[int, int]:
    """Delete `queue`'s range up to seq `top` now, sparing `keep`, and raise its lower bound
    to `top` (the range is done if that is its upper bound); returns (rows, ops deleted)."""
    above, seq = pending[queue]
    part: Range = (above, min(top, seq))
    rows = ops = 0
    started = time.monotonic()
    while True:
        got, gone, _top = piece_top(conn, queue, part, chunk, deltas=deltas, keep=keep, d=d)
        rows += got
        ops += gone
        if got < chunk:
            break
    if top >= seq:
        done(conn, pending, queue, d)
    else:
        m = d.mark
        conn.execute(f"UPDATE drain_pending SET above = {m} WHERE queue = {m}", (top, queue))
        pending[queue] = (top, seq)
    _log.info("drain_spared", queue=queue, spared=len(keep), below=top, rows=rows,
              ms=round((time.monotonic() - started) * 1000))  # fmt: skip
    return rows, ops


def _in_range(
    conn: Db, ids: list[str], queue: str, r: Range, d: PendingSql
) -> list[tuple[str, int]]:
    """The (row key, seq) of those of `ids` whose rows are in `queue`'s range `r`."""
    found: list[tuple[str, int]] = []
    for at in range(0, len(ids), 500):
        chunk = ids[at : at + 500]
        marks = ", ".join([d.mark] * len(chunk))
        sql = f"SELECT id, seq FROM jobs WHERE id IN ({marks}) AND {d.cold()}"
        rows = conn.execute(sql, (*chunk, queue)).fetchall()
        found += [(i, int(s)) for i, s in rows if inside(r, int(s))]
    return found


def _by_queue(plan: Plan, pending: dict[str, Range], updates: bool) -> dict[str, list[str]]:
    """The row keys `plan` writes of queues with a pending range (`updates`: only the
    stored rows it updates; else every row it puts or updates)."""
    out: dict[str, list[str]] = {}
    for key, row in plan.jobs.items():
        if row is None or (updates and row.values is not None):
            continue
        queue = row.queue
        if queue in pending:
            out.setdefault(queue, []).append(key)
    return out


def settle_before(
    conn: Db, pending: dict[str, Range], plan: Plan, d: PendingSql = SQLITE_PENDING
) -> None:
    """Before `plan` is written: an update of a row still in a pending range is an update
    of a drained job; it becomes the range's deletion of that row, and is skipped."""
    for queue, ids in _by_queue(plan, pending, updates=True).items():
        for key, _seq in _in_range(conn, ids, queue, pending[queue], d):
            plan.jobs[key] = None
            plan.skipped += 1


def settle_after(
    conn: Db,
    pending: dict[str, Range],
    plan: Plan,
    *,
    deltas: bool,
    chunk: int,
    d: PendingSql = SQLITE_PENDING,
) -> tuple[int, int]:
    """After `plan` is written: an obliterated queue has no range left; rows `plan` left in
    a pending range were written after the `qdrain`, so the range up to their seqs goes now
    and they stay below it (`finish_to`). Returns (rows deleted, ops deleted)."""
    rows = ops = 0
    for queue in [q for q in plan.obliterated if q in pending]:
        done(conn, pending, queue, d)
    for queue, ids in _by_queue(plan, pending, updates=False).items():
        kept = _in_range(conn, ids, queue, pending[queue], d)
        if kept:
            top = max(seq for _key, seq in kept)
            keys = [key for key, _seq in kept]
            got, gone = finish_to(conn, pending, queue, top, deltas=deltas, chunk=chunk,
                                  keep=keys, d=d)  # fmt: skip
            rows += got
            ops += gone
    return rows, ops
