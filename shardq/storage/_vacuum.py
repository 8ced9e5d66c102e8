"""Giving the database file's free pages back: incremental vacuum, and converting old files.

A deleted row leaves its pages on SQLite's free list: later inserts reuse them, but the file
never shrinks. With `auto_vacuum = INCREMENTAL` (set on every new database by `_schema`),
`PRAGMA incremental_vacuum(N)` moves up to N free pages to the end of the file and truncates
them away, in one short write transaction; the writer runs it a step at a time when it is idle
(`shardq.runtime.writer._vacuum`).

A database created before that setting has `auto_vacuum = NONE`, which only a full `VACUUM`
can change: it rewrites the whole file (into a temporary copy, then back through the WAL), so
it takes time and about twice the file's size of free disk. `convert` runs it; the writer
calls it at start-up for a file small enough (`vacuum_convert_max_bytes`). A `VACUUM` is one
transaction: if it fails (disk full, interrupted) the file is as it was, nothing is lost.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from shardq.storage._errors import StorageError, wrap_error

__all__ = ["AUTO_VACUUM_MODES", "auto_vacuum", "convert", "free_pages", "release_pages"]

AUTO_VACUUM_MODES = ("none", "full", "incremental")  # PRAGMA auto_vacuum's 0, 1, 2


def auto_vacuum(conn: sqlite3.Connection) -> str:
    """The database's auto_vacuum mode: "none", "full" or "incremental"."""
    try:
        (mode,) = conn.execute("PRAGMA auto_vacuum").fetchone()
    except sqlite3.Error as e:
        raise wrap_error(e, "reading auto_vacuum") from e
    return AUTO_VACUUM_MODES[int(mode)]


def free_pages(conn: sqlite3.Connection) -> int:
    """Pages on the free list (read from the file header: cheap)."""
    try:
        (count,) = conn.execute("PRAGMA freelist_count").fetchone()
    except sqlite3.Error as e:
        raise wrap_error(e, "reading the free page count") from e
    return int(count)


def release_pages(conn: sqlite3.Connection, pages: int) -> int:
    """Give up to `pages` free pages back to the file system in one write transaction;
    return how many went (0 on a database that is not in incremental mode).

    Raises `StorageError` (`StorageFull` if the WAL cannot grow); the file is then unchanged.
    """
    before = free_pages(conn)
    try:
        # The pragma frees one page per step of its statement, and `execute` steps a
        # statement without result columns once only: `executescript` steps it to the end.
        # In autocommit mode the statement is its own transaction, rolled back if it fails.
        conn.executescript(f"PRAGMA incremental_vacuum({int(pages)})")
    except sqlite3.Error as e:
        raise wrap_error(e, f"releasing {pages} free pages") from e
    return before - free_pages(conn)


def convert(
    conn: sqlite3.Connection,
    path: Path,
    progress: Callable[[float], None] | None = None,
    *,
    every_s: float = 1.0,
) -> None:
    """Turn a database with `auto_vacuum = NONE` into an incremental one with one `VACUUM`.

    `progress(elapsed_s)` is called every `every_s` seconds while it runs (a VACUUM has no
    measure of how far it is), from another thread: the calling one waits in SQLite. If it
    raises, the VACUUM is interrupted (unless past the phases SQLite checks for that: then it
    completes). Raises `StorageError` if there is not twice the file's
    size free on the disks of the database and of the temporary copy, or if the VACUUM fails
    or was interrupted; the database is unchanged then.
    """
    size = path.stat().st_size
    for where in {path.parent, Path(tempfile.gettempdir())}:
        free = shutil.disk_usage(where).free
        if free < 2 * size:
            raise StorageError(
                f"converting {path} needs about {2 * size} bytes free on {where}, which has {free}"
            )
    (temp_store,) = conn.execute("PRAGMA temp_store").fetchone()
    done = threading.Event()
    ticker = threading.Thread(
        target=_tick, args=(conn, progress, every_s, done), name="vacuum-progress", daemon=True
    )
    try:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        # The copy goes to a temporary file, not to memory (shardq's temp_store): the file may
        # be far larger than the writer should ever hold.
        conn.execute("PRAGMA temp_store = FILE")
        if progress is not None:
            ticker.start()
        conn.execute("VACUUM")
    except sqlite3.Error as e:
        raise wrap_error(e, f"converting {path} to incremental vacuum") from e
    finally:
        done.set()
        if ticker.is_alive():
            ticker.join()
        conn.execute(f"PRAGMA temp_store = {int(temp_store)}")


def _tick(
    conn: sqlite3.Connection,
    progress: Callable[[float], None] | None,
    every_s: float,
    done: threading.Event,
) -> None:
    # A thread, not SQLite's progress handler: a VACUUM runs few virtual machine instructions
    # per row, and copies the file back with none, so the handler can go silent for seconds.
    started = time.monotonic()
    while progress is not None and not done.wait(every_s):
        try:
            progress(time.monotonic() - started)
        except Exception:
            conn.interrupt()  # safe from any thread; the VACUUM then rolls back
            return
