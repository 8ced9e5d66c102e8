"""The writer's status file: what only the writer knows, for the HTTP process to report.

The writer alone sees whether storage fails (a full disk) and how its flushes go. Rather than a
new socket and message kind, it writes these facts to `<run dir>/writer-status.json`
(a temporary file renamed over the old one, so a reader never sees half of it): at once when
storage turns degraded or recovers, and after a flush at most once a second. So the HTTP
process reads facts that are at most a second old while the writer flushes, and exact while it
is idle (nothing changes then). A writer that restarts starts its counters again at zero, as
Prometheus counters may.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from shardq.runtime import _clock
from shardq.storage import StorageError

__all__ = ["DURATION_BUCKETS", "SIZE_BUCKETS", "STATUS_FILE", "WriterStatus", "file_sizes"]

STATUS_FILE: Final = "writer-status.json"
# Seconds: a flush is a SQLite transaction, a millisecond when healthy, a second when the disk
# stalls.
DURATION_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# Mutations per flush: 1 (a lone durable push) up to flush_max_mutations and beyond.
SIZE_BUCKETS: Final = (1, 10, 50, 100, 250, 500, 1000, 5000)
_WRITE_EVERY_S: Final = 1.0
# How often a store that is not a local file (PostgreSQL) is asked its size: a query that
# lists the database's files, so not at every save.
_SIZE_EVERY_S: Final = 10.0
# The status file's size at least: room for the longest error text, written in place.
_RESERVE_BYTES: Final = 8192


def file_sizes(database: str | os.PathLike[str]) -> dict[str, int]:
    """The database's and its WAL's sizes in bytes (0 for a missing file), for log lines."""
    path = Path(database)
    sizes = {}
    for key, file in (("database_bytes", path), ("wal_bytes", path.with_name(path.name + "-wal"))):
        try:
            sizes[key] = file.stat().st_size
        except OSError:
            sizes[key] = 0
    return sizes


class _Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def as_dict(self) -> dict[str, Any]:
        return {"bounds": list(self.bounds), "counts": self.counts, "sum": self.sum}


class WriterStatus:
    """Counts flushes and tracks degradation; `save` writes the file when it is due."""

    def __init__(
        self,
        run_dir: str,
        clock: Callable[[], float] = time.monotonic,
        sizer: Callable[[], int] | None = None,
    ) -> None:
        """`sizer`: the store's size in bytes, for a store the HTTP process cannot stat
        itself (PostgreSQL); asked at most every `_SIZE_EVERY_S` when the file is saved."""
        self._path = Path(run_dir) / STATUS_FILE
        self._clock = clock
        self._written_at = -_WRITE_EVERY_S
        self._sizer = sizer
        self._sized_at = -_SIZE_EVERY_S
        self.database_bytes: int | None = None
        self.degraded = False
        self.disk_full = False
        self.error: str | None = None
        self.since_ms: int | None = None
        self.failures = 0
        self.duration = _Histogram(DURATION_BUCKETS)
        self.size = _Histogram(tuple(float(b) for b in SIZE_BUCKETS))
        # The free list as of the idle writer's last look (`_vacuum`), and the pages it gave
        # back to the file system since it started.
        self.free_pages: int | None = None
        self.pages_vacuumed = 0
        # A Drain's range deleted in pieces (`_drain_pieces`): rows so far, ranges left.
        self.drained_rows = 0
        self.drain_pending_queues = 0

    def flushed(self, mutations: int, seconds: float) -> None:
        """A flush committed; storage works (again). Once a commit, a durable push's too:
        the histograms' `observe` and `save`'s check of the clock inline (three calls)."""
        changed = self.degraded  # `failed` set it with the error: they clear together
        if changed:
            self.degraded = self.disk_full = False
            self.error = self.since_ms = None
        duration, size = self.duration, self.size
        duration.counts[bisect.bisect_left(duration.bounds, seconds)] += 1
        duration.sum += seconds
        size.counts[bisect.bisect_left(size.bounds, mutations)] += 1
        size.sum += mutations
        if changed or self._clock() - self._written_at >= _WRITE_EVERY_S:
            self.save(force=True)

    def vacuum_checked(self, free_pages: int) -> None:
        """The idle writer counted the free pages (and may vacuum them)."""
        self.free_pages = free_pages
        self.save()

    def vacuumed(self, pages: int, free_pages: int) -> None:
        """One vacuum step gave `pages` back; `free_pages` are left."""
        self.pages_vacuumed += pages
        self.free_pages = free_pages
        self.save()

    def drained(self, rows: int) -> None:
        """A piece of a Drain's range deleted `rows` rows."""
        self.drained_rows += rows
        self.save()

    def drain_pending(self, queues: int) -> None:
        """`queues` Drain ranges are left to delete."""
        changed = queues != self.drain_pending_queues
        self.drain_pending_queues = queues
        if changed:  # rare: written at once, with the rows deleted so far
            self.save(force=True)

    def failed(self, error: str, *, disk_full: bool) -> None:
        """A flush failed: storage is degraded until one commits."""
        changed = not self.degraded
        self.failures += 1
        if changed:
            self.since_ms = int(_clock.wall() * 1000)
        self.degraded, self.disk_full, self.error = True, disk_full, error
        self.save(force=changed)

    def save(self, *, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._written_at < _WRITE_EVERY_S:
            return
        self._written_at = now
        if self._sizer is not None and now - self._sized_at >= _SIZE_EVERY_S:
            self._sized_at = now
            # A failed read keeps the last size: storage errors surface through the flushes.
            with contextlib.suppress(StorageError):
                self.database_bytes = self._sizer()
        body = {
            "pid": os.getpid(),
            "degraded": self.degraded,
            "diskFull": self.disk_full,
            "error": self.error,
            "since": self.since_ms,
            "failures": self.failures,
            "flushSeconds": self.duration.as_dict(),
            "flushMutations": self.size.as_dict(),
            "freePages": self.free_pages,
            "pagesVacuumed": self.pages_vacuumed,
            "drainedRows": self.drained_rows,
            "drainPendingQueues": self.drain_pending_queues,
            "databaseBytes": self.database_bytes,
        }
        text = json.dumps(body).encode()
        # Padded (JSON allows trailing blanks) so that when a full disk refuses the new file,
        # the same bytes can overwrite the old one in place: blocks it holds need no space.
        data = text.ljust(max(_RESERVE_BYTES, -(-len(text) // 4096) * 4096), b" ")
        temporary = self._path.with_suffix(".tmp")
        try:
            temporary.write_bytes(data)
            os.replace(temporary, self._path)
        except OSError:
            # Monitoring must never stop the writer; this is how /health learns the disk is
            # full, so it must get through then most of all.
            with contextlib.suppress(OSError):
                self._overwrite(data)

    def _overwrite(self, data: bytes) -> None:
        with self._path.open("r+b") as f:
            if os.fstat(f.fileno()).st_size >= len(data):
                f.write(data)
