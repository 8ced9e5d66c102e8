"""A shard's cold backlog: the engine's reads of its cold jobs, over the shard's own store.

Under a head budget (`[engine] head_jobs` above 0; `shardq.core._head`) the engine keeps each
queue's head in memory and pages the rest in from storage through a `ColdBacklog`. This is
that backlog for a running shard: the reads of `shardq.storage` (`page_waiting`,
`get_job` ...) on a connection of the shard's own, opened on the first read and kept for the
process's life (SQLite in WAL mode gives every process its reader; PostgreSQL a connection of
its own). The shard's recovery and a takeover's loads read through the same store.

A read that fails closes the store, so the next one opens it again, and raises: the command
that read fails with an internal error (`ShardCore._request`), as any failing command does.

Page-ins are logged: a page of `LOG_PAGE_HEADS` heads (`head_jobs` records) or more (a head
refills with less), or one that took `LOG_PAGE_MS` or more, as one line; a run of reads close
together (a queue-wide command reading a whole backlog, a drain) every `LOG_PROGRESS_S` while
it lasts, and its total when the next run starts, if it logged any progress.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection
from typing import Final, TypeVar

import structlog

from shardq.core._mutations import Record
from shardq.storage import Storage, StorageError
from shardq.storage._cold_reads import ColdCounts, ColdPage, Cursor

__all__ = ["LOG_PAGE_HEADS", "StoreBacklog"]

LOG_PAGE_HEADS: Final = 10
"""A page of at least this many times `head_jobs` records is logged."""
LOG_PAGE_MS: Final = 500
"""A page that took at least this long is logged."""
LOG_PROGRESS_S: Final = 2.0
"""A run of page-ins logs its progress this often."""
RUN_GAP_S: Final = 0.25
"""Reads closer together than this make one run (the progress of one long page-in)."""

_log = structlog.get_logger()
T = TypeVar("T")


class StoreBacklog:
    """The `ColdBacklog` of one shard: the cold reads of its own store (module docstring)."""

    def __init__(self, opener: Callable[[], Storage], index: int, head_jobs: int) -> None:
        self._open = opener
        self._index = index
        self._log_records = LOG_PAGE_HEADS * head_jobs
        self._store: Storage | None = None
        self.pages = 0  # page reads so far (Stats)
        self.paged = 0  # records they returned
        # The current run of page-ins: when it started, records, when the last read ended,
        # when it logs its progress next, whether it logged any.
        self._run_started = 0.0
        self._run_records = 0
        self._last_read = 0.0
        self._next_log = 0.0
        self._run_logged = False

    @property
    def store(self) -> Storage:
        """The shard's store, opened on first use. Raises `StorageError`."""
        if self._store is None:
            self._store = self._open()
        return self._store

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(StorageError):
                store.close()

    # -- the reads (`shardq.core._cold.ColdBacklog`) ---------------------------------------

    def page_waiting(
        self, queue: str, after: Cursor | None = None, *, limit: int, max_bytes: int = 4 << 20
    ) -> ColdPage:
        def read(s: Storage) -> ColdPage:
            return s.page_waiting(queue, after, limit=limit, max_bytes=max_bytes)

        return self._page("waiting", queue, read)

    def page_group(
        self,
        queue: str,
        group: str,
        after: Cursor | None = None,
        *,
        limit: int,
        max_bytes: int = 4 << 20,
    ) -> ColdPage:
        return self._page(
            "group",
            queue,
            lambda s: s.page_group(queue, group, after, limit=limit, max_bytes=max_bytes),
        )

    def page_delayed(
        self, queue: str, after: Cursor | None = None, *, limit: int, max_bytes: int = 4 << 20
    ) -> ColdPage:
        def read(s: Storage) -> ColdPage:
            return s.page_delayed(queue, after, limit=limit, max_bytes=max_bytes)

        return self._page("delayed", queue, read)

    def page_made(
        self,
        queue: str,
        kinds: Collection[str],
        after: Cursor | None = None,
        *,
        limit: int,
        desc: bool = False,
        max_bytes: int = 4 << 20,
    ) -> ColdPage:
        def read(s: Storage) -> ColdPage:
            return s.page_made(queue, kinds, after, limit=limit, desc=desc, max_bytes=max_bytes)

        return self._page("made", queue, read)

    def page_by_seq(
        self,
        queue: str,
        kinds: Collection[str],
        after: Cursor | None = None,
        *,
        limit: int,
        made_by: int | None = None,
        max_bytes: int = 4 << 20,
    ) -> ColdPage:
        def read(s: Storage) -> ColdPage:
            return s.page_by_seq(
                queue, kinds, after, limit=limit, made_by=made_by, max_bytes=max_bytes
            )

        return self._page("by_seq", queue, read)

    def get_by_custom_id(self, queue: str, custom_id: str) -> Record | None:
        return self._read(lambda s: s.get_by_custom_id(queue, custom_id))

    def find_unique(self, queue: str, unique_key: str, *, limit: int = 16) -> list[Record]:
        return self._read(lambda s: s.find_unique(queue, unique_key, limit=limit))

    def cold_counts(self, queue: str) -> ColdCounts:
        return self._read(lambda s: s.cold_counts(queue))

    def cold_priorities(self, queue: str) -> dict[int | float, int]:
        return self._read(lambda s: s.cold_priorities(queue))

    def get_job(self, job_id: str) -> Record | None:
        return self._read(lambda s: s.get_job(job_id))

    # -- reading ---------------------------------------------------------------------------

    def _read(self, read: Callable[[Storage], T]) -> T:
        try:
            return read(self.store)
        except StorageError:
            _log.exception("cold backlog read failed; the store is opened again")
            self.close()
            raise

    def _page(self, kind: str, queue: str, read: Callable[[Storage], ColdPage]) -> ColdPage:
        started = time.monotonic()
        page = self._read(read)
        ended = time.monotonic()
        records = len(page.records)
        self.pages += 1
        self.paged += records
        ms = (ended - started) * 1000
        if records >= self._log_records or ms >= LOG_PAGE_MS:
            _log.info(
                "cold page-in",
                shard=self._index,
                kind=kind,
                queue=queue,
                records=records,
                ms=round(ms),
            )
        self._progress(started, ended, records, queue)
        return page

    def _progress(self, started: float, ended: float, records: int, queue: str) -> None:
        """Count the page into the current run of reads, and log the run's progress."""
        if started - self._last_read > RUN_GAP_S:
            if self._run_logged:
                self._log_run("cold page-in done", queue)
            self._run_started, self._run_records = started, 0
            self._next_log, self._run_logged = started + LOG_PROGRESS_S, False
        self._run_records += records
        self._last_read = ended
        if ended >= self._next_log:
            self._next_log = ended + LOG_PROGRESS_S
            self._run_logged = True
            self._log_run("cold page-in progress", queue)

    def _log_run(self, event: str, queue: str) -> None:
        seconds = max(self._last_read - self._run_started, 1e-9)
        _log.info(
            event,
            shard=self._index,
            queue=queue,
            records=self._run_records,
            seconds=round(seconds, 1),
            records_per_s=round(self._run_records / seconds),
        )
