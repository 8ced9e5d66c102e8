"""Backups of the database file: snapshots to S3-compatible storage or a local directory.

`take_backup` copies the live database with `VACUUM INTO`, checks, gzips and uploads it with
a metadata sidecar; `restore` checks a backup in full before it renames it over the database.
`BackupScheduler` takes snapshots on a timer inside `shardq start` when `S3_BACKUP_ENABLED`
is set. Settings use bunqueue's environment names (`BackupSettings`).

Owns: the backup targets (S3, a local directory), the snapshots and their metadata sidecars,
and the schedule's status file.

Receives: the database path and the settings (from the supervisor or the `shardq backup`
commands); snapshots and listings back from a target.

Sends: gzipped snapshots and sidecars to the target; a restored file over the database (only
while no server holds it).
"""

from typing import TYPE_CHECKING

from shardq._lazy import lazy_exports

if TYPE_CHECKING:
    from shardq.backup._core import (
        BackupError,
        BackupInfo,
        ServerRunning,
        list_backups,
        lock_path,
        prune,
        restore,
        take_backup,
        verify,
    )
    from shardq.backup._schedule import (
        EXTERNAL_STORE,
        BackupScheduler,
        backup_status,
        listed_backups,
        read_status,
        scheduled_backups,
    )
    from shardq.backup._settings import BackupSettings
    from shardq.backup._targets import LocalTarget, ObjectInfo, S3Target, Target, open_target

__all__ = [
    "EXTERNAL_STORE",
    "BackupError",
    "BackupInfo",
    "BackupScheduler",
    "BackupSettings",
    "LocalTarget",
    "ObjectInfo",
    "S3Target",
    "ServerRunning",
    "Target",
    "backup_status",
    "list_backups",
    "listed_backups",
    "lock_path",
    "open_target",
    "prune",
    "read_status",
    "restore",
    "scheduled_backups",
    "take_backup",
    "verify",
]

# Where each name lives. Imported on first use: `shardq.backup._core` pulls in the storage
# layer and through it the whole engine (some 5 MB), which the supervisor, which only asks
# whether backups are on (`shardq.backup._settings`), must not hold for the server's life.
_HOME = {
    **dict.fromkeys(
        ("BackupError", "BackupInfo", "ServerRunning", "list_backups", "lock_path", "prune",
         "restore", "take_backup", "verify"),
        "_core",
    ),
    **dict.fromkeys(
        ("EXTERNAL_STORE", "BackupScheduler", "backup_status", "listed_backups", "read_status",
         "scheduled_backups"),
        "_schedule",
    ),
    "BackupSettings": "_settings",
    **dict.fromkeys(("LocalTarget", "ObjectInfo", "S3Target", "Target", "open_target"), "_targets"),
}  # fmt: skip


__getattr__ = lazy_exports(__name__, _HOME, globals())
