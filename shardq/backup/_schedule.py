"""Scheduled snapshots: a daemon thread in the supervisor process.

A thread, not a child process: a snapshot is one `VACUUM INTO` (SQLite releases the GIL while
it copies) plus gzip and an upload, and it needs none of the supervisor's sockets. It never
touches the supervisor's loop, so a slow upload cannot delay a restart or a shutdown; at
shutdown the thread is told to stop and is not waited for beyond `stop`'s timeout.
The outcome of every run is written to `<db>.backup-status.json` for `shardq backup status`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import structlog

from shardq.backup._settings import BackupSettings
from shardq.backup._targets import Target, open_target, require_boto3

__all__ = [
    "EXTERNAL_STORE",
    "BackupScheduler",
    "backup_status",
    "listed_backups",
    "read_status",
    "scheduled_backups",
    "status_path",
]

EXTERNAL_STORE: Final = (
    "shardq's backups copy its SQLite file; a server that stores in PostgreSQL (storage_url) "
    "is backed up with PostgreSQL's own tools (pg_dump, base backups)"
)

log = structlog.get_logger("shardq.backup")


def _core() -> ModuleType:
    # On first use: the snapshot code imports the storage layer and with it the engine,
    # which the supervisor (this schedule's owner) otherwise never needs.
    from shardq.backup import _core

    return _core


def status_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".backup-status.json")


def read_status(db_path: Path) -> dict[str, Any]:
    """What the last scheduled run wrote, or {} if none ran."""
    try:
        value = json.loads(status_path(db_path).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def listed_backups(target: Target) -> list[dict[str, Any]]:
    """The committed backups, oldest first, as `shardq backup list` and `Backup` show them."""
    return [
        {"key": o.key, "size": o.size, "modified": o.modified.isoformat()}
        for o in _core().list_backups(target)
    ]


def backup_status(
    settings: BackupSettings, listed: list[dict[str, Any]], db_path: Path
) -> dict[str, Any]:
    """The summary `shardq backup status` prints, offline or from the server alike."""
    return {
        "database": str(db_path),
        "configured": settings.configured,
        "scheduled": settings.enabled,
        "destination": settings.destination,
        "intervalMs": settings.interval_ms,
        "retention": settings.retention,
        "backups": len(listed),
        "newest": listed[-1] if listed else None,
        "lastRun": read_status(db_path),
    }


def _write_status(db_path: Path, status: dict[str, Any]) -> None:
    path = status_path(db_path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


class BackupScheduler:
    """Takes a snapshot every `settings.interval_ms`, keeping `settings.retention`."""

    def __init__(self, db_path: Path, settings: BackupSettings) -> None:
        self.db_path = db_path
        self.settings = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shardq-backup", daemon=True)
        self.runs = 0

    def start(self) -> BackupScheduler:
        log.info(
            "scheduled backups on",
            destination=self.settings.destination,
            interval_ms=self.settings.interval_ms,
            retention=self.settings.retention,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.interval_ms / 1000):
            self.run_once()

    def run_once(self) -> None:
        """Take one snapshot now; log and record the outcome (never raises)."""
        started = time.time()
        status: dict[str, Any] = {**read_status(self.db_path), "last_attempt_at": started}
        try:
            info = _core().take_backup(
                self.db_path, open_target(self.settings), self.settings.retention
            )
        except Exception as e:  # a failed run must not end the schedule
            log.error("scheduled backup failed", error=str(e))
            status["last_error"] = str(e)
        else:
            log.info("backup taken", key=info.key, size=info.size, seconds=time.time() - started)
            status.update(last_ok_at=time.time(), last_key=info.key, last_error=None)
        self.runs += 1
        try:
            _write_status(self.db_path, status)
        except OSError as e:
            log.warning("cannot write the backup status file", error=str(e))


def scheduled_backups(
    db_path: Path, env: Mapping[str, str] | None = None, *, external_store: bool = False
) -> BackupScheduler | None:
    """Start the schedule if `S3_BACKUP_ENABLED` is set; None otherwise. `external_store`:
    the server stores in PostgreSQL (`storage_url`), not in the file at `db_path`.

    Raises `ValueError` for a bad backup setting, or for backups asked of a server on
    PostgreSQL, so `shardq start` refuses it at once rather than failing six hours later (or
    copying a file the server no longer writes).
    """
    settings = BackupSettings.from_env(env)
    if not settings.enabled:
        return None
    if external_store:
        raise ValueError(EXTERNAL_STORE)
    if settings.bucket and not settings.directory:
        require_boto3()  # refused at startup, not at the first snapshot hours later
    return BackupScheduler(db_path, settings).start()
