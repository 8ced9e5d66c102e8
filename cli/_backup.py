"""`shardq backup now|list|status|verify|restore`: backups of the database file.

`now`, `list`, `status` and `verify` ask the running server (`--url`, the `Backup` command):
it knows its own database file and its backup destination (its environment), so they work
from any directory and any machine that reaches the port. With `--offline` (implied by
`--data-path`, `--config` or `--dir`) they work on the database file and the destination
directly instead, for a server that is down; the destination then comes from this shell's
environment with bunqueue's names (S3_BUCKET, S3_ENDPOINT, ...) or `--dir`.

`restore` is always offline: it needs the server stopped, and refuses while one runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shardq.client._url import DEFAULT_URL

from ._admin import Json, Token, Url, fail, print_json, print_table, session
from ._format import when

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
Offline = Annotated[
    bool,
    typer.Option(
        "--offline", help="Work on the database file and destination, not through the server."
    ),
]
Directory = Annotated[
    Path | None,
    typer.Option(
        "--dir", envvar="SHARDQ_BACKUP_DIR", help="A local backup directory instead of S3."
    ),
]

Key = Annotated[str, typer.Argument(help="The backup's key, as `backup list` shows it.")]


def _db_path(config: Path | None, data_path: str | None) -> Path:
    from shardq.backup import EXTERNAL_STORE
    from shardq.runtime._config import ConfigError, load_config

    try:
        loaded = load_config(config, flags={"data_path": data_path})
    except ConfigError as e:
        fail(str(e), 2)
    if loaded.writer.storage_url:
        fail(EXTERNAL_STORE, 2)
    return Path(loaded.supervisor.data_path)


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


# A backup copies and uploads the whole database: far longer than an admin command may take.
BACKUP_TIMEOUT_S = 600.0


def _offline(offline: bool, *named: object) -> bool:
    return offline or any(value is not None for value in named)


def _ask(url: str, token: str | None, action: str, **fields: object) -> dict[str, Any]:
    """The server's answer to one `Backup` action; a refusal becomes a `fail` line."""
    with session(url, token) as conn:
        command = {"cmd": "Backup", "action": action, **fields}
        return conn.call(command, wait=BACKUP_TIMEOUT_S, idempotent=action != "now")


@backup_app.command("now")
def backup_now(
    config: Config = None,
    data_path: DataPath = None,
    directory: Directory = None,
    offline: Offline = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Take a snapshot now (safe while the server runs) and prune to S3_BACKUP_RETENTION."""
    if _offline(offline, config, data_path, directory):
        from shardq.backup import take_backup

        db = _db_path(config, data_path)
        with _backups(directory) as (settings, target):
            info = asdict(take_backup(db, target, settings.retention))
    else:
        info = _ask(url, token, "now").get("backup") or {}
    if as_json:
        print_json(info)
        return
    typer.echo(
        f"{info.get('key')} ({info.get('size')} bytes, sha256 {str(info.get('sha256'))[:16]}...)"
    )


@backup_app.command("list")
def backup_list(
    directory: Directory = None,
    offline: Offline = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """The committed backups, oldest first, with size and age."""
    if _offline(offline, directory):
        from shardq.backup import listed_backups

        with _backups(directory) as (_, target):
            found = listed_backups(target)
    else:
        found = list(_ask(url, token, "list").get("backups") or [])
    if as_json:
        print_json(found)
        return
    rows = [[b["key"], _size(b["size"]), _shown(b["modified"])] for b in found]
    print_table(None, ["key", "size", "taken"], rows)
    if not found:
        typer.echo("no backups yet (shardq backup now takes one)")


def _size(size: object) -> str:
    value = float(size) if isinstance(size, int | float) else 0.0
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(size)


def _shown(iso: object) -> str:
    """An ISO time from the server as local time and age."""
    try:
        at = datetime.fromisoformat(str(iso))
    except ValueError:
        return str(iso)
    return f"{when(at.timestamp() * 1000)}"


@backup_app.command("restore")
def backup_restore(
    key: Key,
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
    config: Config = None,
    data_path: DataPath = None,
    directory: Directory = None,
    offline: Offline = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """The backup settings, the newest backup, and the last scheduled run."""
    if _offline(offline, config, data_path, directory):
        summary = _offline_status(config, data_path, directory)
    else:
        summary = dict(_ask(url, token, "status").get("status") or {})
    if as_json:
        print_json(summary)
        return
    newest = summary.get("newest") or {}
    last = summary.get("lastRun") or {}
    interval_h = int(summary.get("intervalMs") or 0) / 3_600_000
    lines = [
        f"destination  {summary.get('destination')}",
        f"schedule     every {interval_h:g} h, keeping {summary.get('retention')}"
        if summary.get("scheduled") else "schedule     off (S3_BACKUP_ENABLED is not set)",
        f"backups      {summary.get('backups', 0)}",
        f"newest       {newest.get('key')}, taken {_shown(newest.get('modified'))}"
        if newest else "newest       none",
    ]  # fmt: skip
    if last:
        lines.append(f"last run     {when((last.get('last_attempt_at') or 0) * 1000)}")
        if last.get("last_error"):
            lines.append(f"last error   {last['last_error']}")
    typer.echo("\n".join(lines))


def _offline_status(
    config: Path | None, data_path: str | None, directory: Path | None
) -> dict[str, Any]:
    from shardq.backup import backup_status, listed_backups

    db = _db_path(config, data_path)
    with _backups(directory) as (settings, target):
        listed = listed_backups(target)
    return backup_status(settings, listed, db)


@backup_app.command("verify")
def backup_verify(
    key: Key,
    directory: Directory = None,
    offline: Offline = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Check a backup in full as a restore would (checksum, SQLite integrity), changing nothing."""
    if _offline(offline, directory):
        import tempfile

        from shardq.backup import verify

        with _backups(directory) as (_, target), tempfile.TemporaryDirectory() as scratch:
            info = asdict(verify(target, key, Path(scratch)))
    else:
        info = _ask(url, token, "verify", key=key).get("backup") or {}
    if as_json:
        print_json(info)
        return
    typer.echo(f"{info.get('key')}: intact ({info.get('size')} bytes, sha256 matches)")
