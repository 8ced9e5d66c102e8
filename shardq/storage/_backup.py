"""The SQLite half of backups: a consistent copy of a live database, and checks of a copy.

`snapshot` runs `VACUUM INTO` on its own connection. In WAL mode that is a read transaction:
it copies one consistent state of the database while the writer keeps committing (the writer
is never blocked; only a checkpoint waits for the reader to finish). The copy is compact and
has no WAL of its own, so the single file is the whole backup. While it runs it holds the
swap lock shared, so that the writer's vacuum does not rename a rebuilt file over the database
under it (`_rebuild`). `check_database` is what a
restore runs on a candidate before it may replace the live file.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

from shardq.storage._errors import StorageError
from shardq.storage._rebuild import swap_guard

__all__ = ["SQLITE_HEADER", "check_database", "snapshot"]

SQLITE_HEADER: Final = b"SQLite format 3\x00"
_BUSY_TIMEOUT_MS: Final = 30_000  # a snapshot may wait out a checkpoint; it runs off-line


def _connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    mode = "ro" if read_only else "rw"
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode={mode}", uri=True)
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    return conn


def snapshot(db_path: Path, dest: Path) -> None:
    """Copy the database at `db_path` into the new file `dest` with `VACUUM INTO`, then check
    the copy with `PRAGMA integrity_check`.

    Raises `StorageError` if the database cannot be read, `dest` exists, or the copy fails
    its check (the bad copy is deleted).
    """
    if not db_path.exists():
        raise StorageError(f"no database at {db_path}")
    try:
        # The writer's idle vacuum may rename a compact copy over the live file; it does not
        # while this connection is open (`_rebuild.swap_guard`).
        with swap_guard(db_path, exclusive=False):
            conn = _connect(db_path, read_only=False)
            try:
                conn.execute("VACUUM INTO ?", (str(dest),))
            finally:
                conn.close()
    except sqlite3.Error as e:
        raise StorageError(f"VACUUM INTO {dest} failed: {e}") from e
    try:
        check_database(dest)
    except StorageError:
        dest.unlink(missing_ok=True)
        raise


def check_database(path: Path) -> None:
    """Refuse `path` unless it starts with SQLite's header and passes `integrity_check`.

    Raises `StorageError` naming what is wrong. Opens the file read-only, so a check never
    changes the file it judges.
    """
    with path.open("rb") as f:
        header = f.read(len(SQLITE_HEADER))
    if header != SQLITE_HEADER:
        raise StorageError(f"{path} is not an SQLite database (bad header)")
    try:
        conn = _connect(path, read_only=True)
        try:
            rows = conn.execute("PRAGMA integrity_check").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise StorageError(f"{path} fails integrity_check: {e}") from e
    verdict = [str(row[0]) for row in rows]
    if verdict != ["ok"]:
        raise StorageError(f"{path} fails integrity_check: {'; '.join(verdict[:3])}")
