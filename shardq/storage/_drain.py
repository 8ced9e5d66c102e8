"""A queue's Drain as a range deletion: `("qdrain", queue, seq)`.

Under a head budget most of a drained queue is cold: rows only. Instead of one `del` per cold
job, the engine sends one `qdrain` (`shardq.core._cold_wide`): "delete the cold waiting and
delayed rows of `queue` whose seq is at most `seq`", `seq` being the engine's admission
counter when it drained, above every job it had. The storage deletes them with a `DELETE`
over the index of the cold backlog by (queue, seq) (`cold_by_seq`, partial on `COLD_BACKLOG`),
so its work is one index range, not one statement per job; the `cold_counts` triggers keep
the counts as they keep them for any deletion. The seq bound makes the mutation mean the same
when a batch is applied twice (resent to a restarted writer): a job pushed after the drain
has a higher seq.

One plan of the batch (`_coalesce`) cannot say which rows the range meets: a row put or
changed before the `qdrain` in the same batch is in it as it stands there, one changed after
is not. So a batch holding a `qdrain` is applied as steps in one transaction (`steps`): the
mutations before it as one plan, the deletion, the mutations after it as the next plan, each
plan reading the stored rows as the steps before left them. Such a batch is rare (one per
Drain of a queue with cold jobs); every other batch is applied as before, and no batch pays
a test for it (`coalesce` raises `DrainInBatch` when it meets one, before anything is written).

The deletion runs in statements of at most `chunk` rows (`DRAIN_CHUNK_ROWS`), in seq order,
each deleting first the ops (`job_deltas`) of its rows; above `DRAIN_LOG_ROWS` rows it logs
its progress after each statement (`drain_progress`), and any deletion that removed a row logs
its total and the statements it took (`drain_deleted`). All of
them are in the batch's transaction: a crash rolls the whole batch back, and the shard sends
it again.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import structlog

from shardq.core._mutations import Mutation
from shardq.storage._coalesce import Plan, Stored, remember
from shardq.storage._errors import StorageRejected
from shardq.storage._write import COLD_COLUMNS

__all__ = [
    "DRAIN_CHUNK_ROWS",
    "DRAIN_LOG_ROWS",
    "Applied",
    "Drain",
    "apply_steps",
    "delete_range",
    "delete_sqlite",
    "remember_steps",
    "select_range",
    "statements",
    "steps",
]

DRAIN_CHUNK_ROWS: Final = 50_000
"""Rows per statement of a range deletion (`Store.drain_chunk`): each statement's work is
bounded, and the progress log says how far a long one is."""
DRAIN_LOG_ROWS: Final = 100_000
"""A range deletion of more rows than this logs its progress."""

Drain = tuple[str, int]
"""A `qdrain`'s (queue, seq)."""

Known = dict[str, Stored | None]
Done = list[tuple[Plan | str, Known]]
"""What each step of a batch did, in order: a plan and what its write learned of the rows,
or a drained queue's name."""
Applied = tuple[int, int, Done]
"""(rows written, change in `job_deltas` rows, the steps)."""
WriteSegment = Callable[[Sequence[Mutation], bool], tuple[int, int, Plan, Known]]
"""Coalesces and writes the mutations between two drains (True: the first of the batch,
which may read the store's cache of rows; a later one reads the rows as the steps before
left them); returns (rows written, change in `job_deltas` rows, its plan, what it learned)."""
DeleteRange = Callable[[Drain, int], tuple[int, int]]
"""Deletes a drain's rows, given the change in `job_deltas` rows so far; returns (rows
deleted, ops deleted)."""

Run = Callable[[str, tuple[Any, ...]], int]
"""Runs one statement with its parameters; returns the rows it changed."""

_log = structlog.get_logger("shardq.storage")


def steps(mutations: Sequence[Mutation]) -> list[tuple[Sequence[Mutation], Drain | None]]:
    """`mutations` cut at each `qdrain`: (the mutations before it, its (queue, seq)), and last
    (the mutations after the last one, None). Raises `StorageRejected` for a malformed one."""
    out: list[tuple[Sequence[Mutation], Drain | None]] = []
    start = 0
    for index, m in enumerate(mutations):
        if isinstance(m, list | tuple) and m and m[0] == "qdrain":
            out.append((mutations[start:index], _drain_of(index, m)))
            start = index + 1
    out.append((mutations[start:], None))
    return out


def apply_steps(mutations: Sequence[Mutation], write: WriteSegment, delete: DeleteRange) -> Applied:
    """Apply a batch holding a `qdrain` as its steps (`steps`), in the caller's transaction."""
    written = delta_rows = 0
    done: Done = []
    for index, (segment, drain) in enumerate(steps(mutations)):
        if segment:
            rows, changed, plan, known = write(segment, index == 0)
            written += rows
            delta_rows += changed
            done.append((plan, known))
        if drain is not None:
            rows, ops = delete(drain, delta_rows)
            written += rows
            delta_rows -= ops
            done.append((drain[0], {}))
    return written, delta_rows, done


def remember_steps(cache: dict[str, Stored], limit: int, done: Done) -> dict[str, Stored]:
    """The store's cache of row summaries after the steps `done` committed (`remember` of
    each plan; a drained queue's rows are forgotten, whichever the range deleted)."""
    for what, known in done:
        if isinstance(what, str):
            for key in [k for k, info in cache.items() if info[0] == what]:
                del cache[key]
        else:
            cache = remember(cache, limit, what, known)
    return cache


def _drain_of(index: int, m: Sequence[Any]) -> Drain:
    if len(m) == 3 and type(m[1]) is str and type(m[2]) is int:
        return m[1], m[2]
    raise StorageRejected(f"mutation #{index} (qdrain) must be ('qdrain', str, int): {m!r:.200}")


def select_range(mark: str, indexed: str, order: str) -> str:
    """The row keys of a range's next chunk, off the cold backlog's index by seq."""
    return (
        f"SELECT id FROM jobs{indexed} WHERE queue = {mark} AND cold = 1"
        f" AND state IN ('waiting', 'delayed') AND seq <= {mark}"
        f" ORDER BY seq, {order} LIMIT {mark}"
    )


def statements(mark: str, indexed: str, order: str) -> tuple[str, str]:
    """(delete the chunk's ops, delete the chunk's rows) in a dialect: its parameter
    `mark`, the index clause of the read (SQLite names it), the row key's order."""
    select = select_range(mark, indexed, order)
    return (
        f"DELETE FROM job_deltas WHERE id IN ({select})",
        f"DELETE FROM jobs WHERE id IN ({select})",
    )


def delete_range(
    run: Run,
    sql: tuple[str, str],
    drain: Drain,
    *,
    deltas: bool,
    chunk: int,
) -> tuple[int, int]:
    """Delete the rows of `drain` in statements of `chunk` rows (`sql`: `statements`);
    `deltas`: whether `job_deltas` may hold a row. Returns (rows deleted, ops deleted)."""
    queue, seq = drain
    params = (queue, seq, max(1, chunk))
    rows = ops = statements = 0
    started = time.monotonic()
    while True:
        if deltas:
            ops += max(run(sql[0], params), 0)
        done = max(run(sql[1], params), 0)
        rows += done
        statements += 1
        if rows > DRAIN_LOG_ROWS and done:
            _log.info("drain_progress", queue=queue, rows=rows, ms=_ms(started))
        if done < params[2]:
            break
    if rows:
        _log.info("drain_deleted", queue=queue, seq=seq, rows=rows, statements=statements,
                  ms=_ms(started))  # fmt: skip
    return rows, ops


def delete_sqlite(
    conn: sqlite3.Connection, cold: int, drain: Drain, *, deltas: bool, chunk: int
) -> tuple[int, int]:
    """`delete_range` on SQLite, over the cold backlog's index by seq (`cold`: how many cold
    columns the table has, `_schema.cold_columns`; none, no row is cold)."""
    if not cold:
        return 0, 0
    indexed = " INDEXED BY idx_jobs_cold_by_seq" if cold == COLD_COLUMNS else ""

    def run(sql: str, params: tuple[Any, ...]) -> int:
        return int(conn.execute(sql, params).rowcount)

    return delete_range(run, statements("?", indexed, "id"), drain, deltas=deltas, chunk=chunk)


def _ms(started: float) -> int:
    return round((time.monotonic() - started) * 1000)
