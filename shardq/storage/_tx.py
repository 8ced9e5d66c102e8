"""The one transaction helper: every write to the database goes through `transaction()`."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from shardq.storage._errors import StorageError, wrap_error

__all__ = ["autocommit", "transaction"]


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection, action: str) -> Iterator[None]:
    """Run the block as one write transaction: all of it commits, or none of it does.

    `BEGIN IMMEDIATE` takes the write lock up front, so a competing writer waits on
    `busy_timeout` at the start instead of failing at COMMIT with work already done.
    The connection must be in autocommit mode (`isolation_level=None`).

    Raises `StorageError` (`StorageFull` for SQLITE_FULL) for any `Exception` raised by
    the block or by BEGIN/COMMIT, after rolling back. `BaseException`s such as
    `KeyboardInterrupt` also roll back, and propagate unchanged.
    """
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as e:
        raise wrap_error(e, action) from e
    try:
        yield
        conn.execute("COMMIT")
    except StorageError:
        _rollback(conn)
        raise
    except Exception as e:
        _rollback(conn)
        raise wrap_error(e, action) from e
    except BaseException:
        _rollback(conn)
        raise


def autocommit(conn: sqlite3.Connection, sql: str, params: Sequence[Any], action: str) -> int:
    """Run one write statement as a transaction of its own; return the rows it changed.

    SQLite's autocommit mode commits the statement as it ends, with the same write lock,
    WAL frames and sync as between BEGIN IMMEDIATE and COMMIT, and rolls it back whole if
    it fails: the two statements around it, and a context manager's calls, are left out
    (a lone durable push, `Store.apply`). The connection must be in autocommit mode.

    Raises `StorageError` (`StorageFull` for SQLITE_FULL) for any `Exception` the
    statement raises; nothing of it is then written.
    """
    try:
        changed: int = conn.execute(sql, params).rowcount
    except Exception as e:
        raise wrap_error(e, action) from e
    return changed


def _rollback(conn: sqlite3.Connection) -> None:
    # SQLite may already have rolled back by itself (SQLITE_FULL, an I/O error); a second
    # failure here would only hide the first, more useful one.
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
