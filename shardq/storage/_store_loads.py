"""`Store`'s reads of what a start loads beside the jobs (queue configs, crons, webhooks,
the flow outbox) and of the completed jobs a retention keeps or leaves behind."""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator
from contextlib import AbstractContextManager
from typing import Any

from shardq.core._mutations import Record
from shardq.storage import _schema
from shardq.storage import _seq_reads as _seq
from shardq.storage._write import decode

__all__ = ["GROUPS_VERSION", "MAX_FILTER_QUEUES", "STALE_PAGE", "StoreLoads"]

# A recovery filter names a shard's queues in one `IN (...)`; past this many it is left to the
# caller (SQLite allows 32,766 parameters, and a long list costs more than it filters).
MAX_FILTER_QUEUES = 1000
# Ids of stale completed rows are handed out this many at a time (a few hundred KB).
STALE_PAGE = 10_000
# The schema version that gave job groups their own table (`_schema._v8_queue_groups`).
GROUPS_VERSION = 8


class StoreLoads(ABC):
    """Start-time reads of a SQLite `Store`, for a class that gives the connection, the
    schema's facts and the two read helpers below."""

    _conn: sqlite3.Connection
    _split_seq: bool

    @property
    @abstractmethod
    def schema_version(self) -> int:
        """The schema version of the open database."""

    @abstractmethod
    def _reading(self, action: str) -> AbstractContextManager[None]:
        """A context in which a failed read raises `StorageError` naming `action`."""

    @abstractmethod
    def _read_page(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """The rows of one page of a read."""

    def completed_floor(self, keep: int, queues: Collection[str] | None = None) -> int | None:
        """The seq from which the newest `keep` completed jobs (of `queues`) are stored, or
        None if there are at most `keep`: the `completed_from` that loads just those.

        Raises `StorageError` if the read fails; `ValueError` if `keep` < 1.
        """
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        where, params = _filter(queues)
        if where == _NOTHING:
            return None
        if self._split_seq:  # the hot set's seq indexes only, never the backlog's
            sql = _seq.completed_floor_sql(where)
            args: tuple[Any, ...] = (*params, keep + 1) * len(_schema.HOT_SEQ_INDEXES)
        else:
            sql, args = _completed_floor(where), params
        with self._reading("finding the retained completed jobs"):
            row = self._conn.execute(sql, (*args, keep)).fetchone()
        # Row `keep` (0-based) is the newest one past the window: the window starts above it.
        return None if row is None else int(row[0]) + 1

    def stale_completed(
        self, below: int, queues: Collection[str] | None = None
    ) -> Iterator[list[str]]:
        """The row keys of completed jobs (of `queues`) with a seq below `below`, in lists of
        at most `STALE_PAGE`: rows left by a retention that kept them on disk, to delete.

        Raises `StorageError` (while iterating) if a read fails.
        """
        if queues is None or len(queues) > MAX_FILTER_QUEUES:
            yield from self._stale_pages(_STALE_ALL, (below,))
            return
        # One queue at a time: a range of the `queue` index, already in rowid order.
        for queue in sorted(queues):
            yield from self._stale_pages(_STALE_OF_QUEUE, (queue, below))

    def _stale_pages(self, sql: str, params: tuple[Any, ...]) -> Iterator[list[str]]:
        last = -1
        while True:
            rows = self._read_page(sql, (*params, last, STALE_PAGE))
            if not rows:
                return
            yield [key for key, _ in rows]
            last = rows[-1][1]

    def load_queues(self) -> dict[str, Record]:
        """Every stored queue config, by queue name, with its groups' settings (their own
        rows) as a "groups" map, gid -> settings (`fold_mutations` gives the same shape).
        Raises `StorageError` if the read fails."""
        with self._reading("loading queue configs"):
            rows = self._conn.execute("SELECT name, cfg FROM queue_state").fetchall()
            queues: dict[str, Record] = {name: decode(cfg) for name, cfg in rows}
            if self.schema_version < GROUPS_VERSION:
                return queues  # an older schema (tests open one): groups live in the configs
            sql = "SELECT queue, gid, cfg FROM queue_groups ORDER BY queue, gid"
            for queue, gid, cfg in self._conn.execute(sql):
                queues.setdefault(queue, {}).setdefault("groups", {})[gid] = decode(cfg)
            return queues

    def load_crons(self) -> list[Record]:
        """Every stored cron schedule record. Raises `StorageError` if the read fails."""
        with self._reading("loading cron schedules"):
            rows = self._conn.execute("SELECT rec FROM cron_jobs ORDER BY name").fetchall()
            return [decode(rec) for (rec,) in rows]

    def load_webhooks(self) -> list[Record]:
        """Every stored webhook record. Raises `StorageError` if the read fails."""
        with self._reading("loading webhooks"):
            rows = self._conn.execute("SELECT rec FROM webhooks ORDER BY id").fetchall()
            return [decode(rec) for (rec,) in rows]

    def load_flow_outbox(self) -> list[Record]:
        """Every flow notice not acknowledged yet (docs/protocol.md §20). Raises
        `StorageError` if the read fails."""
        with self._reading("loading the flow outbox"):
            rows = self._conn.execute("SELECT rec FROM flow_outbox ORDER BY key").fetchall()
            return [decode(rec) for (rec,) in rows]


def _completed_floor(where: str) -> str:
    return (
        f"SELECT seq FROM jobs WHERE state = 'completed' AND {where}"
        " ORDER BY seq DESC LIMIT 1 OFFSET ?"
    )


_STALE_ALL = (
    "SELECT id, rowid FROM jobs WHERE state = 'completed' AND seq < ?"
    " AND rowid > ? ORDER BY rowid LIMIT ?"
)
_STALE_OF_QUEUE = (
    "SELECT id, rowid FROM jobs WHERE queue = ? AND state = 'completed' AND seq < ?"
    " AND rowid > ? ORDER BY rowid LIMIT ?"
)


_NOTHING = "0"
"""`_filter`'s condition for no queue at all."""


def _filter(queues: Collection[str] | None) -> tuple[str, tuple[Any, ...]]:
    """A WHERE condition (and its parameters) keeping the jobs of `queues`."""
    if queues is None or len(queues) > MAX_FILTER_QUEUES:
        return "1", ()
    if not queues:
        return _NOTHING, ()
    names = tuple(sorted(queues))
    # The unary `+` keeps SQLite off the `queue` index: through it, every page of a seq-ordered
    # read would sort all of the queues' rows again. The seq index reads them in order, and the
    # rows of other queues cost a comparison each, not a decode.
    return f"+queue IN ({', '.join('?' * len(names))})", names
