"""A Drain's range deleted in pieces after its commit: the pending ranges (SQLite).

A `qdrain` of a million cold rows deleted inside its batch's transaction held the writer for
the whole deletion (8.6 s of CPU, 20-50 s at load): no other batch of any shard committed
meanwhile. From `_schema.DRAIN_VERSION` on, the batch holding the `qdrain` only records the
range, `(queue, seq)`, in the table `drain_pending` (one row per queue; a second Drain of the
queue raises its seq) and commits at once. The writer then deletes the range's rows in
pieces, each its own short transaction (`piece`), between its other batches; the piece that
finds the range empty deletes its row of `drain_pending` in the same transaction.

While a range is pending its rows are still in `jobs`, and every read treats them as gone:

- the cold backlog's reads (`_cold_reads`) add `seq > floor` (the queue's pending seq) to
  their condition, which is exactly "not in the range": the range is the queue's cold
  waiting and delayed rows of seq up to `floor`, and those reads see only such rows;
- `cold_counts` of a queue with a pending range counts the queue's other cold rows (those
  of a higher seq: pushed after the Drain) over the cold backlog's index by seq; the
  `cold_counts` table itself keeps counting every row present, and its triggers take each
  deleted row off as the pieces go, so it is exact again when the range is done;
- `get_job` returns None for a row in a range; `load_jobs` leaves them out; `max_seq` is at
  least every pending seq, so a restarted shard numbers its new jobs above every range.

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
visible in between. PostgreSQL still deletes the range inside the batch (`_postgres`): no
range is ever pending there.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection

import structlog

from shardq.storage._coalesce import Plan
from shardq.storage._drain import DRAIN_LOG_ROWS, Drain, select_range

__all__ = [
    "done",
    "finish",
    "load",
    "piece",
    "record",
    "settle_after",
    "settle_before",
]

_IN_RANGE = "queue = ? AND cold = 1 AND state IN ('waiting', 'delayed') AND seq <= ?"
_INDEXED = " INDEXED BY idx_jobs_cold_by_seq"

_log = structlog.get_logger("shardq.storage")


def load(conn: sqlite3.Connection) -> dict[str, int]:
    """The pending ranges, queue -> seq bound."""
    return {q: int(s) for q, s in conn.execute("SELECT queue, seq FROM drain_pending")}


def record(conn: sqlite3.Connection, pending: dict[str, int], drain: Drain) -> None:
    """Record a `qdrain`'s range (in the caller's transaction; `pending` is updated too)."""
    queue, seq = drain
    conn.execute(
        "INSERT INTO drain_pending VALUES (?, ?)"
        " ON CONFLICT (queue) DO UPDATE SET seq = max(seq, excluded.seq)",
        (queue, seq),
    )
    pending[queue] = max(seq, pending.get(queue, seq))


def _statements(keep: int) -> tuple[str, str]:
    select = select_range("?", _INDEXED, "id")
    if keep:
        spared = f" AND id NOT IN ({', '.join('?' * keep)})"
        select = select.replace(" ORDER BY", spared + " ORDER BY", 1)
    return (
        f"DELETE FROM job_deltas WHERE id IN ({select})",
        f"DELETE FROM jobs WHERE id IN ({select})",
    )


def piece(
    conn: sqlite3.Connection, drain: Drain, rows: int, *, deltas: bool, keep: Collection[str] = ()
) -> tuple[int, int]:
    """Delete up to `rows` rows of a pending range, in seq order, sparing `keep` (in the
    caller's transaction); returns (rows deleted, ops deleted)."""
    ops_sql, rows_sql = _statements(len(keep))
    params = (drain[0], drain[1], *keep, max(1, rows))
    ops = max(conn.execute(ops_sql, params).rowcount, 0) if deltas else 0
    return max(conn.execute(rows_sql, params).rowcount, 0), ops


def done(conn: sqlite3.Connection, pending: dict[str, int], queue: str) -> None:
    """The range of `queue` is deleted: forget it (in the caller's transaction)."""
    conn.execute("DELETE FROM drain_pending WHERE queue = ?", (queue,))
    pending.pop(queue, None)


def finish(
    conn: sqlite3.Connection,
    pending: dict[str, int],
    queue: str,
    *,
    deltas: bool,
    chunk: int,
    keep: Collection[str] = (),
    reason: str,
) -> tuple[int, int]:
    """Delete what is left of `queue`'s range now, sparing `keep`, and forget the range;
    returns (rows deleted, ops deleted)."""
    drain = (queue, pending[queue])
    rows = ops = 0
    started = time.monotonic()
    while True:
        got, gone = piece(conn, drain, chunk, deltas=deltas, keep=keep)
        rows += got
        ops += gone
        if rows > DRAIN_LOG_ROWS and got:
            _log.info("drain_progress", queue=queue, rows=rows, ms=_ms(started))
        if got < chunk:
            break
    done(conn, pending, queue)
    _log.info("drain_deleted", queue=queue, seq=drain[1], rows=rows, ms=_ms(started),
              at_once=reason)  # fmt: skip
    return rows, ops


def _in_range(conn: sqlite3.Connection, ids: list[str], queue: str, seq: int) -> list[str]:
    found: list[str] = []
    for at in range(0, len(ids), 500):
        chunk = ids[at : at + 500]
        sql = f"SELECT id FROM jobs WHERE id IN ({', '.join('?' * len(chunk))}) AND {_IN_RANGE}"
        found += [i for (i,) in conn.execute(sql, (*chunk, queue, seq))]
    return found


def _by_queue(plan: Plan, pending: dict[str, int], updates: bool) -> dict[str, list[str]]:
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


def settle_before(conn: sqlite3.Connection, pending: dict[str, int], plan: Plan) -> None:
    """Before `plan` is written: an update of a row still in a pending range is an update
    of a drained job; it becomes the range's deletion of that row, and is skipped."""
    for queue, ids in _by_queue(plan, pending, updates=True).items():
        for key in _in_range(conn, ids, queue, pending[queue]):
            plan.jobs[key] = None
            plan.skipped += 1


def settle_after(
    conn: sqlite3.Connection, pending: dict[str, int], plan: Plan, *, deltas: bool, chunk: int
) -> tuple[int, int]:
    """After `plan` is written: an obliterated queue has no range left; a row `plan` left
    in a pending range was written after the `qdrain`, so the range is finished now, sparing
    it (`finish`). Returns (rows deleted, ops deleted)."""
    rows = ops = 0
    for queue in [q for q in plan.obliterated if q in pending]:
        done(conn, pending, queue)
    for queue, ids in _by_queue(plan, pending, updates=False).items():
        kept = _in_range(conn, ids, queue, pending[queue])
        if kept:
            got, gone = finish(conn, pending, queue, deltas=deltas, chunk=chunk, keep=kept,
                               reason=f"{len(kept)} rows written after the Drain")  # fmt: skip
            rows += got
            ops += gone
    return rows, ops


def _ms(started: float) -> int:
    return round((time.monotonic() - started) * 1000)
