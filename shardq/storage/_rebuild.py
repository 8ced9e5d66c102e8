"""Shrinking a mostly free SQLite file at once: rebuild a compact copy, then swap it in.

`PRAGMA incremental_vacuum(N)` gives pages back a few at a time, but each page it frees is
looked for along the whole free list (SQLite's `BTALLOC_EXACT` search), so a pass over a free
list of millions of pages is quadratic: about an hour for the 2.1M free pages a 10M-job drain
leaves. A rebuild is linear in what is live instead:

1. `open_copier` + `copy_into` (in a thread of the writer): `VACUUM INTO` a new file beside
   the database, `<db>.rebuild`, on a second connection. In WAL mode that is a read
   transaction on one snapshot: the writer keeps committing meanwhile. The copy keeps the
   page size and `auto_vacuum = INCREMENTAL`, is fsynced, and has no WAL of its own.
2. `Store.swap_in` (in the writer, idle, and only if nothing committed since the copy's
   snapshot): close the database (its WAL, checkpointed just before, goes with it), give it a
   second name (`<db>.retired`, a hard link), rename the copy over it, fsync the directory,
   reopen and configure. The old file is unlinked afterwards, outside the pause.

A crash at any point leaves one whole database under the name: before the rename the old
file (closed or not, with its WAL), after it the new one, already fsynced and holding every
committed row. A leftover `<db>.rebuild` or `<db>.retired` is removed when the writer starts
(`remove_leftover`).

Backups (`_backup.snapshot`) and shards (their load at start-up, their cold reads) open the
database on their own connections from other processes. A file renamed over while such a
connection is open would leave it sharing the `-wal` and `-shm` names with the new file, so
both sides take `swap_guard`'s lock on `<db>.swap-lock`: a backup or a shard's store
(`hold_shared`) holds it shared while its connection is open; the swap takes it exclusive without
waiting, and when a backup holds it the swap is simply tried again at the next idle time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from shardq.storage._errors import StorageError, wrap_error

__all__ = [
    "copy_into",
    "fsync_directory",
    "hold_shared",
    "open_copier",
    "rebuild_path",
    "remove_leftover",
    "retired_path",
    "swap_guard",
]


def rebuild_path(db: Path) -> Path:
    """Where the compact copy of `db` is built."""
    return db.with_name(db.name + ".rebuild")


def retired_path(db: Path) -> Path:
    """The old file's second name during a swap: removing an 8 GB file takes the file system
    a while, so the swap only renames, and the old file is unlinked outside the pause."""
    return db.with_name(db.name + ".retired")


def _lock_path(db: Path) -> Path:
    return db.with_name(db.name + ".swap-lock")


def remove_leftover(db: Path) -> list[str]:
    """Delete a copy that a crash or a failed rebuild left beside `db`; return the names."""
    gone = []
    copy = rebuild_path(db)
    for path in (copy, copy.with_name(copy.name + "-journal"), retired_path(db)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            gone.append(path.name)
    return gone


@contextlib.contextmanager
def swap_guard(db: Path, *, exclusive: bool) -> Iterator[bool]:
    """Hold the lock that keeps a swap and any other connection to `db` apart.

    Shared (a backup's connection): waits for a swap under way (a few ms) and yields True.
    Exclusive (the swap): does not wait; yields False when someone holds it shared.
    """
    try:
        fd = _take_lock(db, exclusive=exclusive)
    except BlockingIOError:
        yield False
        return
    if fd is None:  # a directory nobody may write to: no writer can swap a file there
        yield not exclusive
        return
    try:
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def hold_shared(db: Path) -> int | None:
    """Take `swap_guard`'s lock shared for a connection about to open `db` and kept open
    for a while (a shard's reads); return the descriptor holding it, for `os.close` once the
    connection is closed (None: a directory where no lock file can be made, where no writer
    can swap a file either). Waits for a swap under way (a few ms)."""
    return _take_lock(db, exclusive=False)


def _take_lock(db: Path, *, exclusive: bool) -> int | None:
    """The descriptor holding `db`'s swap lock (None: no lock file can be made there).
    Exclusive does not wait and raises `BlockingIOError` when someone holds it shared."""
    try:
        fd = os.open(_lock_path(db), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        raise
    return fd


def open_copier(db: Path) -> sqlite3.Connection:
    """A second connection to `db` for `copy_into`, usable from another thread (and
    `interrupt()`-ible from the writer's). Raises `StorageError`."""
    try:
        conn = sqlite3.connect(
            f"{db.resolve().as_uri()}?mode=rw", uri=True, isolation_level=None,
            check_same_thread=False,
        )  # fmt: skip
        # It runs in its own thread: it may wait out a checkpoint's moment of exclusive lock.
        conn.execute("PRAGMA busy_timeout = 5000")
    except sqlite3.Error as e:
        raise wrap_error(e, f"opening {db} to rebuild it") from e
    return conn


def copy_into(conn: sqlite3.Connection, dest: Path) -> int:
    """`VACUUM INTO dest` on `conn` (`open_copier`'s), then fsync `dest`; return its size.

    Raises `StorageError` (interrupted, disk full, ...) after deleting what was written.
    """
    try:
        conn.execute("VACUUM INTO ?", (str(dest),))
        # The copy comes in rollback-journal mode; switching it to WAL here spares the swap
        # that write (and its fsync). Closing the only connection removes its empty WAL.
        fresh = sqlite3.connect(dest, isolation_level=None)
        try:
            fresh.execute("PRAGMA journal_mode = WAL")
        finally:
            fresh.close()
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)
    except (sqlite3.Error, OSError) as e:
        with contextlib.suppress(FileNotFoundError):
            dest.unlink()
        if isinstance(e, sqlite3.Error):
            raise wrap_error(e, f"rebuilding into {dest}") from e
        raise StorageError(f"rebuilding into {dest}: {e}") from e


def fsync_directory(path: Path) -> None:
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
