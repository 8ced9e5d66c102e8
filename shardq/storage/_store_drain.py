"""`Store`'s part of a Drain's range deleted in pieces after its commit (`_drain_pending`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator

from shardq.core._mutations import Record, drained
from shardq.storage import _drain_pending as pending
from shardq.storage._coalesce import Plan
from shardq.storage._drain import Drain, delete_sqlite
from shardq.storage._drain_bounds import Range, inside
from shardq.storage._schema import cold_columns
from shardq.storage._tx import transaction

__all__ = ["StoreDrains"]


class StoreDrains:
    """The pending Drain ranges of a SQLite `Store`: recorded by `apply`, deleted a piece at a
    time by `drain_step`, left out of every read."""

    _conn: sqlite3.Connection
    _delta_rows: int
    _drain_table: bool
    _version: int
    drain_chunk: int

    def _open_drains(self) -> None:
        # The ranges as committed (`pending_drains`), and as the batch being applied leaves
        # them: they become the committed ones only once its transaction did.
        self._pending: dict[str, Range] = pending.load(self._conn) if self._drain_table else {}
        self._tentative: dict[str, Range] = self._pending

    @property
    def pending_drains(self) -> dict[str, int]:
        """The Drain ranges not deleted yet, queue -> seq bound."""
        return {queue: r[1] for queue, r in self._pending.items()}

    def drain_step(self, max_rows: int) -> tuple[str, int, bool] | None:
        """Delete up to `max_rows` rows of the first pending range in a transaction of its
        own; None if none is pending, else (its queue, rows deleted, whether it is done).
        Raises `StorageError` (and deletes nothing) if SQLite fails."""
        if not self._pending:
            return None
        queue = min(self._pending)
        after = dict(self._pending)
        with transaction(self._conn, f"deleting a piece of queue {queue!r}'s drained jobs"):
            rows, ops, _top = pending.piece_top(self._conn, queue, after[queue], max_rows,
                                                deltas=self._delta_rows > 0)  # fmt: skip
            if rows < max_rows:
                pending.done(self._conn, after, queue)
        self._pending = after
        self._delta_rows = max(0, self._delta_rows - ops)
        return queue, rows, queue not in after

    def _begin_drains(self) -> None:
        self._tentative = dict(self._pending) if self._pending else {}

    def _commit_drains(self) -> None:
        self._pending = self._tentative

    def _drain(self, drain: Drain, delta_rows: int) -> tuple[int, int]:
        """A `qdrain` of the batch: its range recorded, deleted later (`drain_step`); on a
        schema without the table, deleted now (`_drain.delete_sqlite`)."""
        deltas = self._delta_rows + delta_rows > 0
        if self._drain_table:
            return pending.record(self._conn, self._tentative, *drain, deltas=deltas,
                                  chunk=self.drain_chunk)  # fmt: skip
        cold = cold_columns(self._version)
        return delete_sqlite(self._conn, cold, drain, deltas=deltas, chunk=self.drain_chunk)

    def _settle_before(self, plan: Plan) -> None:
        if self._tentative:
            pending.settle_before(self._conn, self._tentative, plan)

    def _settle_after(self, plan: Plan, delta_rows: int) -> tuple[int, int]:
        if not self._tentative:
            return 0, 0
        deltas = self._delta_rows + delta_rows > 0
        return pending.settle_after(self._conn, self._tentative, plan, deltas=deltas,
                                    chunk=self.drain_chunk)  # fmt: skip

    def _read_floors(self) -> dict[str, Range]:
        return pending.load(self._conn) if self._drain_table else {}


def not_drained(records: Iterable[Record], floors: dict[str, Range]) -> Iterator[Record]:
    """`records` without those in a pending range (`floors`: by queue)."""
    for rec in records:
        r = floors.get(rec.get("queue"))  # type: ignore[arg-type]
        if r is None or not drained(rec, rec["queue"], r[1]) or not inside(r, int(rec["seq"])):
            yield rec
