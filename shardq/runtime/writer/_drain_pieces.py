"""A Drain's range deleted between the writer's batches, a bounded piece at a time.

The batch holding a `qdrain` commits at once; its range stays recorded in storage
(`shardq.storage._drain_pending`, where every read already leaves it out) until the writer
has deleted its rows. It does so here: one piece per turn of its loop, each `Storage.drain_step`
its own transaction, between the flushes, so that a flush waits at most one piece. The first
piece deletes `FIRST_PIECE_ROWS` rows (at most `drain_chunk_rows`); each next one is sized
from the last one's measured rate to take about `drain_piece_ms`, at most twice the last and
at most `drain_chunk_rows` (`drain_piece_ms` 0: every piece `drain_chunk_rows`).

A pending range found at the start (a writer killed mid-deletion) is worked down the same
way. On PostgreSQL a range may also come with a partition (a takeover: the last owner died
or handed it over in the middle of a deletion), with no batch of this node to notice it: the
writer then looks again every `look_s` (a lease round) while it has nothing to delete. A
piece that fails (storage failing, a partition moved) is retried after the next commit (or
look). Progress goes to the log: `drain_progress` about once a second per range,
`drain_deleted` when it is done (rows, pieces, the longest piece, wall and CPU time); the
rows deleted and the ranges left go to the writer's status file
(`shardq_writer_drained_rows`, `..._drain_pending_queues`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import structlog

from shardq.runtime.writer._status import WriterStatus
from shardq.storage import Storage, StorageError

__all__ = ["FIRST_PIECE_ROWS", "DrainPieces"]

FIRST_PIECE_ROWS: Final = 1000
"""Rows of the first piece of a run (then sized from its measured rate)."""
PROGRESS_S: Final = 1.0
"""A range being deleted logs its progress about this often."""

log = structlog.get_logger("shardq.writer")


@dataclass
class _Range:
    """One range's deletion so far."""

    started: float
    cpu: float
    logged: float
    rows: int = 0
    pieces: int = 0
    longest: float = 0.0


class DrainPieces:
    """Deletes the pending Drain ranges of `store` a piece at a time (`step`), while
    `wanted`."""

    def __init__(
        self,
        store: Storage,
        status: WriterStatus,
        *,
        max_rows: int,
        piece_s: float,
        look_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._status = status
        self._max = max(1, max_rows)
        self._piece_s = piece_s
        self._clock = clock
        self._size = self._max if piece_s <= 0 else min(self._max, FIRST_PIECE_ROWS)
        self._ranges: dict[str, _Range] = {}
        self._look_s = look_s
        self._next_look = 0.0
        self._retry = False  # a piece or a look failed: look again after the next commit
        self.wanted = self._look()

    def committed(self, drains: bool) -> None:
        """A batch committed; `drains`: it held a `qdrain`, so it may have recorded a range.
        Only then, or after a failed piece or look, are the ranges looked at: a commit
        without a `qdrain` records none (a takeover's ranges are `tick`'s)."""
        if (drains or self._retry) and not self.wanted:
            self.wanted = self._look()

    def deadline(self) -> float | None:
        """When to look for ranges again (None: not until a commit)."""
        return None if self.wanted or self._look_s is None else self._next_look

    def tick(self, now: float) -> None:
        """Look for ranges if it is time (`look_s`)."""
        if not self.wanted and self._look_s is not None and now >= self._next_look:
            self.wanted = self._look()

    def _look(self) -> bool:
        if self._look_s is not None:
            self._next_look = self._clock() + self._look_s
        try:
            pending = self._store.pending_drains
        except StorageError:
            self._retry = True
            return False
        self._retry = False
        self._status.drain_pending(len(pending))
        return bool(pending)

    def step(self) -> None:
        """Delete one piece of the first pending range."""
        started, cpu = self._clock(), time.process_time()
        size = self._size
        try:
            got = self._store.drain_step(size)
        except StorageError as e:
            log.warning("drain piece failed; retried after the next commit", error=str(e))
            self.wanted = False
            self._retry = True
            return
        if got is None:
            self.wanted = False
            self._status.drain_pending(0)
            return
        queue, rows, done = got
        took = self._clock() - started
        self._resize(size, rows, took, done)
        r = self._ranges.get(queue)
        if r is None:
            r = self._ranges[queue] = _Range(started, cpu, started)
        r.rows += rows
        r.pieces += 1
        r.longest = max(r.longest, took)
        self._status.drained(rows)
        if done:
            del self._ranges[queue]
            self._finished(queue, r)
            self.wanted = self._look()
        elif self._clock() - r.logged >= PROGRESS_S:
            r.logged = self._clock()
            log.info("drain_progress", queue=queue, rows=r.rows, pieces=r.pieces,
                     piece_rows=size, ms=_ms(self._clock() - r.started))  # fmt: skip

    def _resize(self, size: int, rows: int, took: float, done: bool) -> None:
        if self._piece_s <= 0 or done or rows < size or took <= 0:
            return
        wanted = int(rows * self._piece_s / took)
        self._size = max(1, min(self._max, 2 * size, wanted))

    def _finished(self, queue: str, r: _Range) -> None:
        log.info(
            "drain_deleted",
            queue=queue,
            rows=r.rows,
            pieces=r.pieces,
            longest_piece_ms=round(r.longest * 1000, 1),
            ms=_ms(self._clock() - r.started),
            cpu_ms=_ms(time.process_time() - r.cpu),
        )


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
