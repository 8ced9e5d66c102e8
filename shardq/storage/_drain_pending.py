"""A Drain's range deleted in pieces after its commit: the pending ranges (SQLite).

A `qdrain` of a million cold rows deleted inside its batch's transaction held the writer for
the whole deletion (8.6 s of CPU, 20-50 s at load): no other batch of any shard committed
meanwhile. From `_schema.DRAIN_VERSION` on, the batch holding the `qdrain` only records the
range, `(queue, seq)`, in the table `drain_pending` (one row per queue; a second Drain of the
queue raises its seq) and commits at once. Its rows are the queue's cold waiting and delayed
ones of seq up to `seq` and above `above` (NULL, none, until rows are spared: below). The
writer then deletes the range's rows in pieces, each its own short transaction (`piece`),
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
from shardq.storage._drain_bounds import Range, inside

__all__ = [
    "done",
    "finish_to",
    "load",
    "piece",
    "record",
    "settle_after",
    "settle_before",
]

_COLD = "queue = ? AND cold = 1 AND state IN ('waiting', 'delayed')"
_INDEXED = " INDEXED BY idx_jobs_cold_by_seq"

_log = structlog.get_logger("shardq.storage")


def load(conn: sqlite3.Connection) -> dict[str, Range]:
    """The pending ranges by queue."""
    sql = "SELECT queue, above, seq FROM drain_pending"
    return {q: (None if a is None else int(a), int(s)) for q, a, s in conn.execute(sql)}


def record(conn: sqlite3.Connection, pending: dict[str, Range], queue: str, seq: int) -> None:
    """Record a `qdrain`'s range (in the caller's transaction; `pending` is updated too): a
    queue's range already pending grows to every seq up to the higher bound."""
    conn.execute(
        "INSERT INTO drain_pending VALUES (?, NULL, ?)"
        " ON CONFLICT (queue) DO UPDATE SET seq = max(seq, excluded.seq), above = NULL",
        (queue, seq),
    )
    pending[queue] = (None, max(seq, pending.get(queue, (None, seq))[1]))


def _statements(r: Range, keep: int) -> tuple[str, str]:
    lower = "" if r[0] is None else " AND seq > ?"
    spared = f" AND id NOT IN ({', '.join('?' * keep)})" if keep else ""
    select = (
        f"SELECT id FROM jobs{_INDEXED} WHERE {_COLD} AND seq <= ?{lower}{spared}"
        " ORDER BY seq, id LIMIT ?"
    )
    return (
        f"DELETE FROM job_deltas WHERE id IN ({select})",
        f"DELETE FROM jobs WHERE id IN ({select})",
    )


def piece(
    conn: sqlite3.Connection,
    queue: str,
    r: Range,
    rows: int,
    *,
    deltas: bool,
    keep: Collection[str] = (),
) -> tuple[int, int]:
    """Delete up to `rows` rows of `queue`'s range `r`, in seq order, sparing `keep` (in the
    caller's transaction); returns (rows deleted, ops deleted)."""
    ops_sql, rows_sql = _statements(r, len(keep))
    lower = () if r[0] is None else (r[0],)
    params = (queue, r[1], *lower, *keep, max(1, rows))
    ops = max(conn.execute(ops_sql, params).rowcount, 0) if deltas else 0
    return max(conn.execute(rows_sql, params).rowcount, 0), ops


def done(conn: sqlite3.Connection, pending: dict[str, Range], queue: str) -> None:
    """The range of `queue` is deleted: forget it (in the caller's transaction)."""
    conn.execute("DELETE FROM drain_pending WHERE queue = ?", (queue,))
    pending.pop(queue, None)


def finish_to(
    conn: sqlite3.Connection,
    pending: dict[str, Range],
    queue: str,
    top: int,
    *,
    deltas: bool,
    chunk: int,
    keep: Collection[str],
) -> tuple[int, int]:
    """Delete `queue`'s range up to seq `top` now, sparing `keep`, and raise its lower bound
    to `top` (the range is done if that is its upper bound); returns (rows, ops deleted)."""
    above, seq = pending[queue]
    part: Range = (above, min(top, seq))
    rows = ops = 0
    started = time.monotonic()
    while True:
        got, gone = piece(conn, queue, part, chunk, deltas=deltas, keep=keep)
        rows += got
        ops += gone
        if got < chunk:
            break
    if top >= seq:
        done(conn, pending, queue)
    else:
        conn.execute("UPDATE drain_pending SET above = ? WHERE queue = ?", (top, queue))
        pending[queue] = (top, seq)
    _log.info("drain_spared", queue=queue, spared=len(keep), below=top, rows=rows,
              ms=round((time.monotonic() - started) * 1000))  # fmt: skip
    return rows, ops


def _in_range(
    conn: sqlite3.Connection, ids: list[str], queue: str, r: Range
) -> list[tuple[str, int]]:
    """The (row key, seq) of those of `ids` whose rows are in `queue`'s range `r`."""
    found: list[tuple[str, int]] = []
    for at in range(0, len(ids), 500):
        chunk = ids[at : at + 500]
        sql = f"SELECT id, seq FROM jobs WHERE id IN ({', '.join('?' * len(chunk))}) AND {_COLD}"
        found += [(i, int(s)) for i, s in conn.execute(sql, (*chunk, queue)) if inside(r, s)]
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


def settle_before(conn: sqlite3.Connection, pending: dict[str, Range], plan: Plan) -> None:
    """Before `plan` is written: an update of a row still in a pending range is an update
    of a drained job; it becomes the range's deletion of that row, and is skipped."""
    for queue, ids in _by_queue(plan, pending, updates=True).items():
        for key, _seq in _in_range(conn, ids, queue, pending[queue]):
            plan.jobs[key] = None
            plan.skipped += 1


def settle_after(
    conn: sqlite3.Connection, pending: dict[str, Range], plan: Plan, *, deltas: bool, chunk: int
) -> tuple[int, int]:
    """After `plan` is written: an obliterated queue has no range left; rows `plan` left in
    a pending range were written after the `qdrain`, so the range up to their seqs goes now
    and they stay below it (`finish_to`). Returns (rows deleted, ops deleted)."""
    rows = ops = 0
    for queue in [q for q in plan.obliterated if q in pending]:
        done(conn, pending, queue)
    for queue, ids in _by_queue(plan, pending, updates=False).items():
        kept = _in_range(conn, ids, queue, pending[queue])
        if kept:
            top = max(seq for _key, seq in kept)
            keys = [key for key, _seq in kept]
            got, gone = finish_to(conn, pending, queue, top, deltas=deltas, chunk=chunk, keep=keys)
            rows += got
            ops += gone
    return rows, ops
