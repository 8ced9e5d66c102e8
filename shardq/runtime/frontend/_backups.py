"""The `Backup` command: backups asked of the running server (docs/protocol.md §21.7).

`{cmd: "Backup", action: "now" | "list" | "status" | "verify", key?}` lets `shardq backup ...
--url` (or any client) take, list and check backups from any directory or machine that reaches
the port. The server knows its own database file and reads the destination from its own
environment (`shardq.backup.BackupSettings`), so the client needs neither.

The work runs in a thread of the front end, one backup action at a time: `VACUUM INTO` reads a
consistent snapshot through its own SQLite connection while the writer goes on committing
(WAL), so a snapshot costs the writer nothing; running it inside the writer's single loop
would stop every commit for the length of the copy. Restore is not offered: it needs the
server stopped (`shardq backup restore`, offline).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

import structlog

from shardq.backup import EXTERNAL_STORE
from shardq.protocol import error_reply
from shardq.runtime._spec import ChildSpec
from shardq.runtime.frontend._replies import answer

__all__ = ["BACKUP_ACTIONS", "BackupCommand"]

BACKUP_ACTIONS: Final = ("now", "list", "status", "verify")
MAX_KEY_CHARS: Final = 512
NO_DESTINATION: Final = (
    "Backups are not configured: set SHARDQ_BACKUP_DIR or S3_BUCKET in the server's environment"
)
BUSY: Final = "A backup action is already running; try again when it ends"

Reply = dict[str, Any]
_log = structlog.get_logger()


class BackupCommand:
    def __init__(self, spec: ChildSpec) -> None:
        self._db = Path(spec.data_path)
        self._external = spec.external_store
        self._busy = False
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references

    @property
    def handlers(self) -> dict[str, Any]:
        return {"Backup": self._handle}

    def _handle(self, client: Any, req: object, frame: dict[str, Any]) -> None:
        action, key = frame.get("action"), frame.get("key")
        if action not in BACKUP_ACTIONS:
            error = f"Invalid action: expected one of {', '.join(BACKUP_ACTIONS)}"
            answer(client, req, error_reply(error))
            return
        if action == "verify" and (not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS):
            answer(client, req, error_reply("Invalid key: a backup's key"))
            return
        if action == "now" and self._external:
            answer(client, req, error_reply(f"Backup failed: {EXTERNAL_STORE}"))
            return
        if self._busy:
            answer(client, req, error_reply(BUSY))
            return
        self._busy = True
        task = asyncio.ensure_future(self._answer(client, req, str(action), key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, client: Any, req: object, action: str, key: object) -> None:
        try:
            reply = await asyncio.to_thread(run_action, self._db, action, key)
        except Exception as e:  # a bug here must still answer, and free the next action
            _log.exception("backup command failed", action=action)
            reply = error_reply(f"Backup failed: {type(e).__name__}: {e}")
        finally:
            self._busy = False
        answer(client, req, reply)


def run_action(db: Path, action: str, key: object) -> Reply:
    """Run one backup action on the server's database (in a thread); the reply."""
    from shardq.backup import (
        BackupError,
        BackupSettings,
        backup_status,
        listed_backups,
        open_target,
        take_backup,
        verify,
    )

    try:
        settings = BackupSettings.from_env()
        if not settings.configured and action != "status":
            return error_reply(NO_DESTINATION)
        target = open_target(settings) if settings.configured else None
        if action == "now" and target is not None:
            started = time.monotonic()
            info = take_backup(db, target, settings.retention)
            seconds = round(time.monotonic() - started, 3)
            _log.info("backup taken", key=info.key, size=info.size, seconds=seconds, asked=True)
            return {"ok": True, "backup": asdict(info) | {"seconds": seconds}}
        if action == "verify" and target is not None:
            return {"ok": True, "backup": asdict(verify(target, str(key), db.parent))}
        listed = listed_backups(target) if target is not None else []
        if action == "list":
            return {"ok": True, "backups": listed}
        return {"ok": True, "status": backup_status(settings, listed, db)}
    except (BackupError, OSError, ValueError) as e:
        return error_reply(f"Backup failed: {e}")
