"""Storage errors, and the one place a low-level failure becomes one of them."""

from __future__ import annotations

import sqlite3

from shardq.errors import ShardqError

__all__ = [
    "StorageError",
    "StorageFenced",
    "StorageFull",
    "StorageRejected",
    "is_disk_full",
    "wrap_error",
]


class StorageError(ShardqError):
    """The database could not be opened, read or written; nothing was half-applied."""


class StorageFull(StorageError):
    """SQLite reported SQLITE_FULL: the disk (or the configured size cap) is full.

    The writer keeps the batch and retries; `/health` reports degraded meanwhile.
    """


class StorageRejected(StorageError):
    """The batch itself is at fault: a mutation SQLite or msgpack cannot take (an integer out
    of SQLite's 64-bit range, a malformed mutation, a constraint). Retrying the same batch
    fails the same way, so the writer isolates the mutations at fault instead (every other
    failure, disk full and a busy database included, is worth retrying).
    """


class StorageFenced(StorageError):
    """The database refused a batch: it writes a partition whose lease this node no longer
    holds (another node took it, its fencing epoch moved on; docs/cluster.md). Retrying
    fails the same way: the writer drops the batch and the node stops serving the partition.
    `lost` names the partitions the check found lost."""

    def __init__(self, message: str, lost: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.lost = lost


# Result codes that blame the statement's values, not the database or the disk.
_REJECTING_CODES = frozenset(
    {
        sqlite3.SQLITE_TOOBIG,
        sqlite3.SQLITE_CONSTRAINT,
        sqlite3.SQLITE_MISMATCH,
        sqlite3.SQLITE_RANGE,
    }
)
# sqlite3 raises these (with no result code) for a value it cannot bind.
_REJECTING_SQLITE_ERRORS = (sqlite3.InterfaceError, sqlite3.DataError, sqlite3.IntegrityError)


# Primary result codes whose bare SQLite message does not tell an operator what to do.
_HINTS: dict[int, str] = {
    sqlite3.SQLITE_NOTADB: "the file is not a SQLite database",
    sqlite3.SQLITE_CORRUPT: "the database file is corrupt",
    sqlite3.SQLITE_CANTOPEN: "the file cannot be opened (is the directory writable?)",
    sqlite3.SQLITE_READONLY: "the database is read-only (check file and directory permissions)",
    sqlite3.SQLITE_BUSY: "another process holds the write lock",
}


def _primary_code(exc: BaseException) -> int | None:
    # Python reports the *extended* code (e.g. SQLITE_IOERR_WRITE); its low byte is the primary.
    # Errors raised by the sqlite3 module itself (closed connection ...) carry no code at all.
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` is SQLite's SQLITE_FULL (by code, or by message on odd builds)."""
    if not isinstance(exc, sqlite3.Error):
        return False
    return _primary_code(exc) == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc)


def wrap_error(exc: BaseException, action: str) -> StorageError:
    """Turn a low-level failure during `action` into a `StorageError` (or `StorageFull`).

    The caller raises the result `from exc`, so the original stays attached as the cause.
    """
    if is_disk_full(exc):
        return StorageFull(f"{action}: database or disk is full ({exc})")
    code = _primary_code(exc)
    if _rejects_the_values(exc, code):
        return StorageRejected(f"{action}: {type(exc).__name__}: {exc}")
    hint = _HINTS.get(code) if code is not None else None
    detail = f"{hint} ({exc})" if hint else f"{type(exc).__name__}: {exc}"
    return StorageError(f"{action}: {detail}")


def _rejects_the_values(exc: BaseException, code: int | None) -> bool:
    if not isinstance(exc, sqlite3.Error):
        # OverflowError binding an int past 64 bits, TypeError/ValueError from msgpack or a
        # malformed mutation: raised by our own code on the batch's values, never by the disk.
        return True
    if isinstance(exc, sqlite3.ProgrammingError) and "binding" in str(exc):
        return True  # "Error binding parameter": a value of a type SQLite cannot store
    return code in _REJECTING_CODES or isinstance(exc, _REJECTING_SQLITE_ERRORS)
