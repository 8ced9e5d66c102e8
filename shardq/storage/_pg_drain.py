"""`PostgresStore`'s part of a Drain's range deleted in pieces after its commit.

The same design as SQLite's (`_drain_pending`, whose statements run here in PostgreSQL's
dialect): from `_pg_schema.DRAIN_VERSION` on, the batch holding a `qdrain` records the range
in `drain_pending` and commits at once; the writer deletes its rows a piece at a time
(`drain_step`), each piece its own short transaction that takes the rows' counts off
`cold_counts` itself; every read leaves a pending range out.

What differs is that several nodes share one database (docs/cluster.md). A range belongs to
its queue's partition, so to the node that holds it:

- a node's store knows the ranges as the table holds them, read again whenever its fence's
  partitions change (`_refresh`: a takeover brings the ranges the last owner left, which
  only the owner writes, so none appears while a partition stays held);
- `pending_drains` and `drain_step` see only the ranges of the partitions the node holds
  now; a piece is fenced as a batch is (the partition's lease row locked `FOR SHARE`, the
  transaction rolled back if it moved) and locks its range's row, so a piece of a node that
  has just lost the partition cannot delete rows the new owner spared;
- a node killed in the middle of a deletion leaves its range in the table: whichever node
  holds the partition next (itself after a restart, or another after the lease ran out)
  reads it and goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardq.storage import _drain_pending as pending
from shardq.storage import _pg_schema
from shardq.storage._coalesce import Plan
from shardq.storage._cold_count_table import PG_EMPTY_COUNTS, PG_SKIP_SETTING, pg_counted_delete
from shardq.storage._drain import Drain, delete_range, select_range, statements
from shardq.storage._drain_bounds import Range
from shardq.storage._drain_pending import POSTGRES_PENDING as PG
from shardq.storage._errors import StorageError
from shardq.storage._pg_fence import FENCE_SQL, Fence, check
from shardq.storage._pg_schema import Conn, pg_error

__all__ = ["PgDrains"]


class PgDrains:
    """The pending Drain ranges of a `PostgresStore`: recorded by `apply`, deleted a piece at
    a time by `drain_step` (by the node holding the queue's partition), left out of reads."""

    _conn: Conn
    _version: int
    _deltas_table: bool
    _drain_table: bool
    drain_chunk: int
    fence: Fence | None
    _connection: Callable[[], Conn]
    """The open connection, a new one if the last was lost (`PostgresStore._connection`)."""

    def _open_drains(self) -> None:
        # The ranges as committed, and as the batch being applied leaves them (`_store_drain`
        # says why there are two); `_seen` is the fence's partitions they were read under.
        self._drain_table = self._version >= _pg_schema.DRAIN_VERSION
        self._pending: dict[str, Range] = pending.load(self._conn) if self._drain_table else {}
        self._tentative: dict[str, Range] = self._pending
        self._seen: Mapping[int, int] | None = None

    @property
    def pending_drains(self) -> dict[str, int]:
        """The Drain ranges not deleted yet, queue -> seq bound: those of the partitions this
        node holds (every one without a fence). Raises `StorageError` if the read fails."""
        self._refresh()
        return {queue: r[1] for queue, r in self._pending.items() if self._holds(queue)}

    def drain_step(self, max_rows: int) -> tuple[str, int, bool] | None:
        """Delete up to `max_rows` rows of the first pending range this node may work, in a
        transaction of its own; None if there is none, else (its queue, rows deleted, whether
        it is done). Raises `StorageError` (and deletes nothing) if PostgreSQL fails, and
        `StorageFenced` if the queue's partition moved meanwhile."""
        queues = sorted(self.pending_drains)
        if not queues:
            return None
        queue = queues[0]
        after = dict(self._pending)
        conn = self._connection()
        try:
            with conn.transaction():
                self._fence_queue(queue)
                # The range as committed, its row locked: the owner's batch that spares rows
                # in it (`settle_after`) and this piece go one after the other.
                sql = "SELECT above, seq FROM drain_pending WHERE queue = %s FOR UPDATE"
                row = conn.execute(sql, (queue,)).fetchone()
                rows = 0
                if row is None:
                    after.pop(queue, None)
                else:
                    r = after[queue] = (None if row[0] is None else int(row[0]), int(row[1]))
                    deltas = self._deltas_table
                    rows, _ops, top = pending.piece_top(
                        conn, queue, r, max_rows, deltas=deltas, d=PG
                    )
                    if rows < max_rows:
                        pending.done(conn, after, queue, PG)
                    elif top is not None:
                        self._passed(after, queue, top - 1)
        except StorageError:
            raise  # `StorageFenced` (the partition moved), or no connection to be had
        except Exception as e:
            raise pg_error(e, f"deleting a piece of queue {queue!r}'s drained jobs") from e
        self._pending = after
        return queue, rows, queue not in after

    def _passed(self, after: dict[str, Range], queue: str, below: int) -> None:
        """A piece deleted every row of `queue`'s range up to seq `below` (in its seq order;
        `below` is one less than its last row's, in case of a tie): the range now starts
        above it. PostgreSQL keeps a deleted row's index entries until a vacuum, and the
        next piece's read of the index then starts past them: from the range's lower bound
        it walked every entry the earlier pieces left (200,000 rows: 20 s of the server's
        CPU against 1.4 s deleted at once)."""
        above, seq = after[queue]
        if above is not None and below <= above:
            return
        sql = "UPDATE drain_pending SET above = %s WHERE queue = %s"
        self._conn.execute(sql, (below, queue))
        after[queue] = (below, seq)

    def _holds(self, queue: str) -> bool:
        fence = self.fence
        return fence is None or fence.holds(queue)

    def _refresh(self) -> None:
        """Read the ranges again if the fence's partitions changed since they were read."""
        fence = self.fence
        if fence is None or not self._drain_table:
            return
        held = fence.held()
        if held is self._seen or not held:
            return
        try:
            self._pending = pending.load(self._connection())
        except StorageError:
            raise
        except Exception as e:
            # A connection lost (a PostgreSQL restart takes the partitions and then gives
            # them back) is a `StorageError` like any other read's: the writer retries.
            raise pg_error(e, "reading the pending drains") from e
        self._seen = held

    def _fence_queue(self, queue: str) -> None:
        """In the open transaction: raise `StorageFenced` unless this node still holds the
        partition of `queue` (its lease row locked until the transaction ends)."""
        if self.fence is None:
            return
        parts, epochs = self.fence.epochs_for({queue})
        found = self._conn.execute(FENCE_SQL, (parts, epochs, self.fence.node_id)).fetchall()
        check(self.fence.node_id, parts, found)

    def _begin_drains(self) -> None:
        """At the start of a batch's transaction."""
        self._refresh()
        self._tentative = dict(self._pending) if self._pending else {}

    def _commit_drains(self) -> None:
        self._pending = self._tentative

    def _drain(self, drain: Drain, _delta_rows: int) -> tuple[int, int]:
        """A `qdrain` of the batch, once its queue's partition is fenced (as a plan's queues
        are): its range recorded, deleted later (`drain_step`); on a schema without the table,
        deleted now (`_delete_now`)."""
        if not _pg_schema.cold_columns(self._version):
            return 0, 0  # no column says cold: no row is
        self._fence_queue(drain[0])
        if self._drain_table:
            return pending.record(self._conn, self._tentative, *drain, PG,
                                  deltas=self._deltas_table, chunk=self.drain_chunk)  # fmt: skip
        return self._delete_now(drain)

    def _delete_now(self, drain: Drain) -> tuple[int, int]:
        """Delete a `qdrain`'s rows in its batch (`_drain.delete_range`) over the cold
        backlog's index (a schema before `DRAIN_VERSION`)."""
        conn = self._conn
        sql = statements("%s", "", PG.order)
        counted = self._version >= _pg_schema.COUNTED_VERSION
        if counted:
            # The statement counts its rows, not the trigger (`_cold_count_table`).
            sql = (sql[0], pg_counted_delete(select_range("%s", "", PG.order)))
            conn.execute("SELECT set_config(%s, 'on', true)", (PG_SKIP_SETTING,))

        def run(sql: str, params: tuple[Any, ...]) -> int:
            cur = conn.execute(sql, params)
            return int(cur.fetchone()[0]) if sql.startswith("WITH") else int(cur.rowcount)  # type: ignore[index]

        done = delete_range(run, sql, drain, deltas=self._deltas_table, chunk=self.drain_chunk)
        if counted:
            conn.execute("SELECT set_config(%s, 'off', true)", (PG_SKIP_SETTING,))
            conn.execute(PG_EMPTY_COUNTS, (drain[0],))
        return done

    def _settle_before(self, plan: Plan) -> None:
        if self._tentative:
            pending.settle_before(self._conn, self._tentative, plan, PG)

    def _settle_after(self, plan: Plan) -> tuple[int, int]:
        if not self._tentative:
            return 0, 0
        return pending.settle_after(self._conn, self._tentative, plan, deltas=self._deltas_table,
                                    chunk=self.drain_chunk, d=PG)  # fmt: skip
