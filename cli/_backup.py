"""`shardq backup now|list|restore|status`: backups of the database file.

These work on the database file and the backup destination directly, not through the
server: a backup must be takeable from the server's host whatever state the server is in,
and a restore needs the server stopped. The database path is the server's own setting
(`--config`, the environment, or `--data-path`); the destination comes from the environment
with bunqueue's names (S3_BUCKET, S3_ENDPOINT, S3_ACCESS_KEY_ID, ...) or `--dir`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ._admin import Json, fail, print_json, print_table

if TYPE_CHECKING:
    from shardq.backup import BackupSettings, Target

__all__ = ["backup_app"]

# shardq.backup is imported inside each command: it pulls in the storage layer, which every
# other `shardq` command would otherwise pay for at startup.

backup_app = typer.Typer(
    help="Back up and restore the database (S3 or a local directory).", no_args_is_help=True
)

Config = Annotated[
    Path | None, typer.Option("--config", help="The server's TOML config (for data_path).")
]
DataPath = Annotated[
    str | None, typer.Option("--data-path", help="The database file (default: the server's).")
]
Directory = Annotated[
    Path | None,
    typer.Option(
        "--dir", envvar="SHARDQ_BACKUP_DIR", help="A local backup directory instead of S3."
    ),
]


def _db_path(config: Path | None, data_path: str | None) -> Path:
    from shardq.runtime._config import ConfigError, load_config

    try:
        return Path(load_config(config, flags={"data_path": data_path}).data_path)
    except ConfigError as e:
        fail(str(e), 2)


@contextmanager
def _backups(directory: Path | None) -> Iterator[tuple[BackupSettings, Target]]:
    """(settings, target), with backup and client errors turned into one line."""
    from shardq.backup import BackupError, BackupSettings, open_target

    env = dict(os.environ)
    if directory is not None:
        env["SHARDQ_BACKUP_DIR"] = str(directory)
    try:
        settings = BackupSettings.from_env(env)
        target = open_target(settings)
    except ValueError as e:
        fail(str(e), 2)
    try:
        yield settings, target
    except (BackupError, OSError) as e:
        fail(str(e))
    except Exception as e:  # boto3's errors: one line, the S3 error code and message
        fail(f"{settings.destination}: {type(e).__name__}: {e}")


@backup_app.command("now")
def backup_now(
    config: Config = None, data_path: DataPath = None, directory: Directory = None
) -> None:
    """Take a snapshot now (safe while the server runs) and prune to S3_BACKUP_RETENTION."""
    from shardq.backup import take_backup

    db = _db_path(config, data_path)
    with _backups(directory) as (settings, target):
        info = take_backup(db, target, settings.retention)
    typer.echo(f"{info.key} ({info.size} bytes, sha256 {info.sha256[:16]}...)")


def _age(modified: datetime) -> str:
    seconds = int((datetime.now(UTC) - modified).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@backup_app.command("list")
def backup_list(directory: Directory = None, as_json: Json = False) -> None:
    """The committed backups, oldest first, with size and age."""
    from shardq.backup import list_backups

    with _backups(directory) as (_, target):
        found = list_backups(target)
    if as_json:
        print_json([{"key": o.key, "size": o.size, "modified": o.modified} for o in found])
        return
    print_table(None, ["key", "size", "age"], [[o.key, o.size, _age(o.modified)] for o in found])


@backup_app.command("restore")
def backup_restore(
    key: Annotated[str, typer.Argument(help="The backup's key, as `backup list` shows it.")],
    force: Annotated[
        bool, typer.Option("--force", help="Restore even though a server holds the database.")
    ] = False,
    config: Config = None,
    data_path: DataPath = None,
    directory: Directory = None,
) -> None:
    """Check a backup in full and rename it over the database (the server must be stopped).

    The replaced file is kept as <db>.pre-restore. A truncated or corrupt backup is refused
    and the database is not touched.
    """
    from shardq.backup import restore

    db = _db_path(config, data_path)
    with _backups(directory) as (_, target):
        info = restore(db, target, key, force=force)
    typer.echo(f"restored {info.key} into {db} (previous file kept as {db}.pre-restore)")


@backup_app.command("status")
def backup_status(
    config: Config = None, data_path: DataPath = None, directory: Directory = None,
    as_json: Json = False,
) -> None:  # fmt: skip
    """The backup settings, the newest backup, and the last scheduled run."""
    from shardq.backup import list_backups, read_status

    db = _db_path(config, data_path)
    with _backups(directory) as (settings, target):
        found = list_backups(target)
    s = settings
    summary = {
        "scheduled": s.enabled,
        "destination": s.destination,
        "interval_ms": s.interval_ms,
        "retention": s.retention,
        "backups": len(found),
        "newest": found[-1].key if found else None,
        "last_run": read_status(db),
    }
    if as_json:
        print_json(summary)
        return
    for name, value in summary.items():
        typer.echo(f"{name}: {value}")
