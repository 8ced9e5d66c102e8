"""The file side of `Store`: checkpoints, the free pages given back, pragmas and the schema,
the progress beat of long statements, and the error mapping every read shares.

A mixin: `Store` (`_store.py`) sets `_conn` and `_path`; nothing here writes a job.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from shardq.storage import _rebuild, _schema, _vacuum
from shardq.storage._errors import StorageError, wrap_error

__all__ = ["PROGRESS_STEPS", "StoreFile", "beating"]

# SQLite calls `set_progress`'s beat once per this many virtual-machine steps of a statement:
# about 12,000 rows of a scan (10-20 ms), so the beat's own clock check costs nothing measurable.
PROGRESS_STEPS = 100_000


class StoreFile:
    """The SQLite file's upkeep and its reads' error mapping, for `Store`."""

    _conn: sqlite3.Connection
    _pragmas: dict[str, Any] | None
    _path: Path
    _changes_before: int = 0  # rows the connections closed before this one changed

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Copy the WAL into the database file and truncate it; True if it completed.

        False means a reader still needed old pages; the WAL is then only partly copied and a
        later checkpoint finishes the job. `wait=False` gives up at once on a reader instead
        of waiting `busy_timeout` for it (the idle writer, which must not hold up a commit).
        Raises `StorageError` if SQLite fails.
        """
        with self._reading("checkpointing the WAL"):
            if wait:
                return self._truncate_wal()
            (timeout,) = self._conn.execute("PRAGMA busy_timeout").fetchone()
            self._conn.execute("PRAGMA busy_timeout = 0")
            try:
                return self._truncate_wal()
            finally:
                self._conn.execute(f"PRAGMA busy_timeout = {int(timeout)}")

    def _truncate_wal(self) -> bool:
        busy, _log, _done = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return int(busy) == 0

    @property
    def auto_vacuum(self) -> str:
        """The file's auto_vacuum mode: "incremental" (created by this shardq), or "none"
        (created before; `convert_to_incremental` changes it). Raises `StorageError`."""
        return _vacuum.auto_vacuum(self._conn)

    def database_bytes(self) -> int:
        """The file's and its WAL's sizes, in bytes (0 for a missing one)."""
        total = 0
        for name in (self._path, f"{self._path}-wal"):
            with contextlib.suppress(OSError):
                total += os.stat(name).st_size
        return total

    def free_pages(self) -> int:
        """Pages the file holds but no row uses (SQLite's free list). Raises `StorageError`."""
        return _vacuum.free_pages(self._conn)

    def release_pages(self, pages: int) -> int:
        """Give up to `pages` free pages back to the file system, in one short transaction;
        return how many went (0 unless the file is in incremental mode). Raises
        `StorageError` (`StorageFull` included) and leaves the file as it was."""
        return _vacuum.release_pages(self._conn, pages)

    def page_counts(self) -> tuple[int, int, int]:
        """The file's pages, the free ones among them, and the page size in bytes. Raises
        `StorageError`."""
        with self._reading("counting pages"):
            pages, free, size = (
                int(self._conn.execute(f"PRAGMA {name}").fetchone()[0])
                for name in ("page_count", "freelist_count", "page_size")
            )
            return pages, free, size

    def change_mark(self) -> int:
        """Rows this store changed since it opened (through all its connections): the same
        mark twice means nothing was written in between (a rebuild's copy is then still the
        whole database)."""
        return self._changes_before + self._conn.total_changes

    def swap_in(self, copy: Path) -> bool:
        """Replace the database file with `copy` (a compact copy of it, `_rebuild`), as one
        pause: checkpoint, close, rename, fsync the directory, reopen. Call it only when
        nothing was written since the copy's snapshot, outside a transaction.

        The old file is left as `_rebuild.retired_path` for the caller to unlink outside the
        pause. Returns False, leaving everything as it was, when another connection (a backup)
        holds the swap lock or a reader keeps the WAL from being emptied. Raises
        `StorageError` if the file cannot be replaced (the old one is reopened) or the new one
        cannot be opened.
        """
        if self._pragmas is None:
            raise StorageError("a store on a caller's connection cannot swap its file")
        with _rebuild.swap_guard(self._path, exclusive=True) as alone:
            if not alone or not self.checkpoint(wait=False):
                return False
            self._changes_before += self._conn.total_changes
            self._conn.close()  # the last connection: the empty WAL and its index go
            try:
                wal = Path(f"{self._path}-wal")
                if wal.exists() and wal.stat().st_size > 0:
                    raise StorageError(f"{wal} still holds frames after the close")
                retired = _rebuild.retired_path(self._path)
                retired.unlink(missing_ok=True)
                os.link(self._path, retired)  # so that the rename frees no blocks
                os.replace(copy, self._path)
                _rebuild.fsync_directory(self._path.parent)
            except (OSError, StorageError) as e:
                self._reconnect()
                raise StorageError(f"swapping {copy} in: {e}") from e
            self._reconnect()
        return True

    def _reconnect(self) -> None:
        assert self._pragmas is not None
        try:
            fresh = sqlite3.connect(self._path, isolation_level=None)
            _schema.configure(fresh, **self._pragmas)
        except sqlite3.Error as e:
            raise wrap_error(e, f"reopening {self._path}") from e
        self._conn = fresh

    def convert_to_incremental(self, progress: Callable[[float], None] | None = None) -> None:
        """Rewrite the file once with a full VACUUM so that it can give pages back; see
        `_vacuum.convert` (`progress(elapsed_s)` about every second). Raises `StorageError`
        (not enough free disk, SQLite failed) and then leaves the file as it was."""
        _vacuum.convert(self._conn, self._path, progress)

    def pragmas(self) -> dict[str, object]:
        """The connection's settings as SQLite reports them (journal_mode, synchronous ...).

        Raises `StorageError` if the read fails.
        """
        with self._reading("reading pragmas"):
            return _schema.read_pragmas(self._conn)

    def describe(self) -> _schema.SchemaInfo:
        """The schema as stored: version, applied migrations, columns, indexes.

        Raises `StorageError` if the read fails.
        """
        return _schema.describe(self._conn)

    def set_progress(self, beat: Callable[[], None] | None) -> None:
        """Call `beat` every `PROGRESS_STEPS` steps of any statement of this connection (None:
        stop). A beat that raises is logged by nothing and aborts nothing: it is swallowed."""
        if beat is None:
            self._conn.set_progress_handler(None, 0)
        else:
            self._conn.set_progress_handler(beating(beat), PROGRESS_STEPS)

    def _reopen(self) -> None:
        """Replace the connection with a new one configured alike (nothing for a store built
        on a connection of the caller's, which `_pragmas` None marks).

        What it frees: the old connection's prepared statements (Python's cache of 128, and
        SQLite's memory for them) and the weak references it keeps to its last 200 cursors.
        They were made one by one all through the busy period, so they sit a few in each of
        the allocator's arenas, and an arena goes back to the kernel only once every block
        in it is free: after a drain those few hundred objects kept some 30 MB of otherwise
        empty arenas in the writer. The new connection is opened before the old one is
        closed, so the WAL never loses its last connection (which would checkpoint it now).
        """
        if self._pragmas is None:
            return
        fresh = sqlite3.connect(self._path, isolation_level=None)
        try:
            _schema.configure(fresh, **self._pragmas)
        except BaseException:
            fresh.close()
            raise
        self._changes_before += self._conn.total_changes
        old, self._conn = self._conn, fresh
        old.close()

    @contextlib.contextmanager
    def _reading(self, action: str) -> Iterator[None]:
        # Reads run in autocommit mode and need no transaction; only the error mapping is
        # shared with writes. ValueError covers a corrupt msgpack blob.
        try:
            yield
        except StorageError:
            raise
        except (sqlite3.Error, ValueError) as e:
            raise wrap_error(e, f"{self._path}: {action}") from e


def beating(beat: Callable[[], None]) -> Callable[[], int]:
    """`beat` as SQLite's progress handler: whatever it raises is swallowed, and it never
    aborts the statement (a non-zero return would)."""

    def handler() -> int:
        with contextlib.suppress(Exception):
            beat()
        return 0

    return handler
