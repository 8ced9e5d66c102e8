"""The idle vacuum's way for a long free list: rebuild the file compact, then swap it in.

Incremental steps cost more per page the longer the free list (`shardq.storage._rebuild`):
after a 10M-job drain they would take an hour. When a pass finds at least
`vacuum_rebuild_min_free_pages` free pages making at least `vacuum_rebuild_min_free_percent`
of the file, or more than `vacuum_step_max_free_pages` (on which no step may run), `IdleVacuum`
hands it to `FileRebuild` instead:

- `start` checks the disk (the live pages plus `vacuum_rebuild_disk_margin_mb` must be free
  beside the database), notes the store's change mark and starts a thread that copies the
  database with `VACUUM INTO` on its own connection. The writer serves meanwhile; the copy
  runs on the other core, outside the GIL (SQLite releases it).
- A commit (`committed`) makes the copy useless: the thread is interrupted and the copy
  deleted; the next idle pass starts over.
- `poll`, at the writer's idle steps: when the copy is done and the mark unchanged, the
  writer checkpoints (one step), then swaps the copy in (`Store.swap_in`, the next step,
  again only if nothing changed): one pause of a close, a rename, a directory fsync and a
  reopen, measured and logged as `swap_ms`. The copy's thread then unlinks the old file.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from shardq.runtime._sections import WriterSettings
from shardq.storage import Storage, StorageError, Store
from shardq.storage._rebuild import (
    copy_into,
    open_copier,
    rebuild_path,
    remove_leftover,
    retired_path,
)

__all__ = ["FileRebuild", "RebuildSettings", "rebuild_of"]

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class RebuildSettings:
    """When a pass rebuilds rather than steps (`min_free_pages` 0: never). A list longer
    than `steps_max_free_pages` (0: no such limit), on which no step may run, is rebuilt
    whatever share of the file it is."""

    min_free_pages: int = 0
    min_free_percent: int = 50
    disk_margin_bytes: int = 64 << 20
    steps_max_free_pages: int = 0


@dataclass(slots=True)
class _Copy:
    """A copy under way in its thread."""

    mark: int  # the store's change mark when it started
    started: float
    conn_ready: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    error: str = ""
    size: int = 0
    checkpointed: bool = False
    interrupt: Callable[[], None] | None = None
    # Set once the copy was swapped in or dropped: the thread then unlinks the old file (if
    # swapped) and ends. Starting a thread inside the swap's pause cost up to 37 ms at load.
    settled: threading.Event = field(default_factory=threading.Event)
    swapped: bool = False


class FileRebuild:
    """Rebuilds `store`'s file into a compact copy in a thread and swaps it in when idle."""

    def __init__(
        self, store: Store, settings: RebuildSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._copy: _Copy | None = None
        self.last_swap_s = 0.0  # the last swap's pause
        if settings.min_free_pages > 0 and (gone := remove_leftover(store.path)):
            log.info("removed the copy of an unfinished vacuum rebuild", files=gone)

    @property
    def running(self) -> bool:
        """Whether a copy is under way or waits to be swapped in."""
        return self._copy is not None

    def wanted(self, pages: int, free: int) -> bool:
        """Whether a free list of `free` pages in a file of `pages` calls for a rebuild."""
        s = self._settings
        if not 0 < s.min_free_pages <= free:
            return False
        return free * 100 >= s.min_free_percent * pages or 0 < s.steps_max_free_pages < free

    def start(self, pages: int, free: int, page_size: int) -> bool:
        """Start copying; False (logged) if the disk lacks room for the copy."""
        path = self._store.path
        need = (pages - free) * page_size + self._settings.disk_margin_bytes
        room = shutil.disk_usage(path.parent).free
        if room < need:
            log.warning("vacuum rebuild skipped: too little free disk for the copy",
                        needed_bytes=need, free_bytes=room)  # fmt: skip
            return False
        copy = _Copy(self._store.change_mark(), self._clock())
        self._copy = copy
        threading.Thread(
            target=_run_copy, args=(path, copy), name="vacuum-rebuild", daemon=True
        ).start()
        copy.conn_ready.wait(5.0)  # so that `committed` can interrupt it from now on
        return True

    def committed(self) -> None:
        """Something was written: the copy under way no longer holds everything."""
        copy = self._copy
        if copy is not None and not copy.done.is_set() and copy.interrupt is not None:
            copy.interrupt()

    def elapsed(self) -> float:
        return 0.0 if self._copy is None else self._clock() - self._copy.started

    def copied_bytes(self) -> int:
        """How far the copy is (its file's size now)."""
        try:
            return rebuild_path(self._store.path).stat().st_size
        except OSError:
            return 0

    def poll(self) -> str:
        """Advance: "copying", "checkpointed" (the copy is ready, the WAL emptied), "swapped",
        "stale" (something was written: dropped), "busy" (a backup or a reader kept it from
        being swapped: retried later) or "failed" (logged, dropped)."""
        copy = self._copy
        assert copy is not None
        if not copy.done.is_set():
            if self._store.change_mark() != copy.mark and copy.interrupt is not None:
                copy.interrupt()  # a drain piece wrote (it does not call `committed`)
            return "copying"
        if self._store.change_mark() != copy.mark:
            return self._drop(copy, "stale")
        if copy.error:
            return self._drop(copy, "failed")
        if not copy.checkpointed:
            if not self._store.checkpoint(wait=False):
                return "busy"
            copy.checkpointed = True
            return "checkpointed"
        return self._swap(copy)

    def _swap(self, copy: _Copy) -> str:
        started = self._clock()
        try:
            swapped = self._store.swap_in(rebuild_path(self._store.path))
        except StorageError as e:
            copy.error = str(e)
            return self._drop(copy, "failed")
        self.last_swap_s = self._clock() - started
        if not swapped:  # kept: swapped at a later idle step if nothing is written till then
            copy.checkpointed = False
            return "busy"
        self._copy = None
        copy.swapped = True
        copy.settled.set()  # its thread unlinks the old file: seconds for gigabytes
        return "swapped"

    def _drop(self, copy: _Copy, why: str) -> str:
        self._copy = None
        copy.settled.set()
        remove_leftover(self._store.path)
        if why == "failed":
            log.warning("vacuum rebuild failed; incremental steps instead", error=copy.error)
        return why

    def cancel(self) -> None:
        """Stop a copy under way and delete it (the writer stops)."""
        copy = self._copy
        if copy is None:
            return
        if copy.interrupt is not None:
            copy.interrupt()
        copy.done.wait(5.0)
        self._drop(copy, "stale")


def rebuild_of(
    store: Storage, settings: WriterSettings, clock: Callable[[], float] = time.monotonic
) -> FileRebuild | None:
    """The rebuild `settings` ask for, for a SQLite store (None: never rebuild)."""
    if not isinstance(store, Store) or settings.vacuum_rebuild_min_free_pages <= 0:
        return None
    wanted = RebuildSettings(
        settings.vacuum_rebuild_min_free_pages,
        settings.vacuum_rebuild_min_free_percent,
        settings.vacuum_rebuild_disk_margin_mb << 20,
        settings.vacuum_step_max_free_pages,
    )
    return FileRebuild(store, wanted, clock)


def _run_copy(db: Path, copy: _Copy) -> None:
    try:
        conn = open_copier(db)
    except StorageError as e:
        copy.error = str(e)
        copy.conn_ready.set()
        copy.done.set()
        return
    copy.interrupt = conn.interrupt
    copy.conn_ready.set()
    try:
        copy.size = copy_into(conn, rebuild_path(db))
    except StorageError as e:
        copy.error = str(e)
    finally:
        conn.close()
        copy.done.set()
    copy.settled.wait()
    if copy.swapped:
        retired_path(db).unlink(missing_ok=True)
