"""Take, list, prune and restore backups of the database file.

A backup is two objects: `<stem>.json`, the metadata sidecar (SHA-256 and size of the
uncompressed database, creation time, shardq version), and `<stem>.db.gz`, the gzipped
`VACUUM INTO` copy. The sidecar is uploaded first and the payload last, so the payload's
presence is the commit point: a backup whose payload is missing never happened, and `list`
shows only committed ones. Stems start with a UTC timestamp, so sorting keys sorts by age.

Restore never writes the live file until a candidate passed every check: the checksum and
size against the sidecar, SQLite's header, and `PRAGMA integrity_check`. The candidate is
written beside the database (same filesystem) and renamed over it, which is atomic. The file
it replaces is kept as `<db>.pre-restore` (with its WAL), since a restore is a decision an
operator may want to undo.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import os
import secrets
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from shardq._version import __version__
from shardq.backup._targets import ObjectInfo, Target
from shardq.errors import ShardqError
from shardq.storage._backup import check_database, snapshot
from shardq.storage._errors import StorageError

__all__ = [
    "BackupError",
    "BackupInfo",
    "ServerRunning",
    "list_backups",
    "lock_path",
    "prune",
    "restore",
    "take_backup",
    "verify",
]

PAYLOAD: Final = ".db.gz"
SIDECAR: Final = ".json"
_CHUNK: Final = 1 << 20


class BackupError(ShardqError):
    """A backup could not be taken, found or restored; the message says why."""


class ServerRunning(BackupError):
    """A restore was refused because a server holds the database's lock."""


@dataclass(frozen=True)
class BackupInfo:
    key: str  # the payload's key, what `restore` takes
    created_at: str  # ISO 8601, UTC
    size: int  # bytes of the database, uncompressed
    compressed_size: int
    sha256: str  # of the uncompressed database


def lock_path(db_path: Path) -> Path:
    """The lock file a running supervisor holds an exclusive `flock` on: `<db>.lock` beside
    the database, named after its resolved path (the supervisor's own rule)."""
    real = db_path.resolve()
    return real.with_name(real.name + ".lock")


@contextlib.contextmanager
def _server_lock(db_path: Path, force: bool) -> Iterator[bool]:
    """Hold the server's lock for the restore, so no server starts on a half-swapped file.

    Yields True if the lock is held. If a server holds it, raises `ServerRunning`, or with
    `force` yields False and goes on without it.
    """
    fd = os.open(lock_path(db_path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            held = False
        if not held and not force:
            raise ServerRunning(
                f"a shardq server is running on {db_path} (lock {lock_path(db_path)}); "
                "stop it first, or pass --force"
            )
        yield held
    finally:
        os.close(fd)


def _new_stem(now: datetime) -> str:
    return f"shardq-{now.strftime('%Y%m%dT%H%M%S%f')}Z-{secrets.token_hex(4)}"


def _stem(key: str) -> str:
    for suffix in (PAYLOAD, SIDECAR):
        if key.endswith(suffix):
            return key[: -len(suffix)]
    return key


def _compress(source: Path, dest: Path) -> tuple[str, int, int]:
    """gzip `source` into `dest`; (SHA-256 of the uncompressed bytes, size, gzipped size)."""
    digest, size = hashlib.sha256(), 0
    with source.open("rb") as src, gzip.open(dest, "wb", compresslevel=6) as out:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    return digest.hexdigest(), size, dest.stat().st_size


def take_backup(db_path: Path, target: Target, retention: int | None = None) -> BackupInfo:
    """Snapshot the database at `db_path` (live or not) into `target`; prune to `retention`.

    Raises `BackupError` if the snapshot, its check or an upload fails.
    """
    now = datetime.now(UTC)
    stem = _new_stem(now)
    # Beside the database: the uncompressed copy needs the same headroom the disk has anyway.
    with tempfile.TemporaryDirectory(dir=db_path.parent, prefix=".shardq-backup-") as tmp:
        raw, packed, meta = Path(tmp, "snapshot.db"), Path(tmp, "payload.gz"), Path(tmp, "m")
        try:
            snapshot(db_path, raw)
        except StorageError as e:
            raise BackupError(str(e)) from e
        sha, size, packed_size = _compress(raw, packed)
        info = BackupInfo(stem + PAYLOAD, now.isoformat(), size, packed_size, sha)
        meta.write_text(json.dumps({**asdict(info), "shardq_version": __version__}))
        try:
            target.put(stem + SIDECAR, meta)
            target.put(stem + PAYLOAD, packed)  # last: the commit point
        except Exception as e:
            raise BackupError(f"upload of {stem} failed: {e}") from e
    if retention is not None:
        prune(target, retention)
    return info


def _committed(objects: list[ObjectInfo]) -> list[ObjectInfo]:
    return sorted((o for o in objects if o.key.endswith(PAYLOAD)), key=lambda o: o.key)


def list_backups(target: Target) -> list[ObjectInfo]:
    """The committed backups (payloads present), oldest first."""
    return _committed(target.list())


def prune(target: Target, retention: int) -> list[str]:
    """Delete all but the newest `retention` backups, and sidecars left by failed uploads
    older than the newest backup; the keys deleted."""
    objects = target.list()
    committed = _committed(objects)
    doomed = [o.key for o in committed[: max(len(committed) - retention, 0)]]
    newest = _stem(committed[-1].key) if committed else ""
    live = {_stem(o.key) for o in committed}
    orphans = [
        o.key
        for o in objects
        if o.key.endswith(SIDECAR) and _stem(o.key) not in live and _stem(o.key) < newest
    ]
    deleted: list[str] = []
    for key in doomed:
        for part in (key, _stem(key) + SIDECAR):  # the payload first: uncommit, then tidy
            target.delete(part)
            deleted.append(part)
    for key in orphans:
        target.delete(key)
        deleted.append(key)
    return deleted


def _read_meta(target: Target, stem: str, tmp: Path) -> dict[str, Any]:
    path = tmp / "meta.json"
    try:
        target.get(stem + SIDECAR, path)
        meta = json.loads(path.read_text())
    except Exception as e:
        raise BackupError(f"backup {stem}: cannot read its metadata: {e}") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str):
        raise BackupError(f"backup {stem}: its metadata has no checksum")
    return meta


def _unpack(packed: Path, candidate: Path, meta: dict[str, Any], stem: str) -> None:
    """gunzip `packed` into `candidate` and compare checksum and size with the sidecar."""
    digest, size = hashlib.sha256(), 0
    try:
        with gzip.open(packed, "rb") as src, candidate.open("wb") as out:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except (OSError, EOFError, zlib.error) as e:
        raise BackupError(f"backup {stem} is truncated or corrupt: {e}") from e
    if digest.hexdigest() != meta["sha256"] or size != meta.get("size", size):
        raise BackupError(f"backup {stem} fails its checksum: it is corrupt")


def _swap_in(candidate: Path, db_path: Path) -> None:
    """Rename `candidate` over `db_path`, keeping the old file and its WAL as .pre-restore.

    The old WAL must be gone before the rename: SQLite would replay it onto the new file.
    """
    aside = db_path.with_name(db_path.name + ".pre-restore")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{aside}{suffix}").unlink(missing_ok=True)
    if db_path.exists():
        os.link(db_path, aside)  # a second name: the live file stays in place until the rename
    for suffix in ("-wal", "-shm"):
        old = Path(f"{db_path}{suffix}")
        if old.exists():
            os.replace(old, f"{aside}{suffix}")
    os.replace(candidate, db_path)
    dir_fd = os.open(db_path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _fetch_checked(target: Target, stem: str, tmp: Path) -> tuple[Path, dict[str, Any]]:
    """Download backup `stem` into `tmp`, unpack it and run every check restore runs; the
    checked database file and the sidecar. Raises `BackupError` naming what failed."""
    meta = _read_meta(target, stem, tmp)
    packed, candidate = tmp / "payload.gz", tmp / "candidate.db"
    try:
        target.get(stem + PAYLOAD, packed)
    except Exception as e:
        raise BackupError(f"backup {stem}: cannot fetch it: {e}") from e
    _unpack(packed, candidate, meta, stem)
    packed.unlink()  # its room is the disk's headroom for the candidate
    try:
        check_database(candidate)
    except StorageError as e:
        raise BackupError(f"backup {stem} refused: {e}") from e
    return candidate, meta


def _info(stem: str, meta: dict[str, Any]) -> BackupInfo:
    return BackupInfo(
        stem + PAYLOAD,
        str(meta.get("created_at", "")),
        int(meta.get("size", 0)),
        int(meta.get("compressed_size", 0)),
        str(meta["sha256"]),
    )


def verify(target: Target, key: str, scratch: Path) -> BackupInfo:
    """Check backup `key` in full, as a restore would (checksum, size, SQLite header,
    `integrity_check`), without touching any database. `scratch` is a directory with room
    for one uncompressed copy. Raises `BackupError` if the backup is missing or damaged."""
    stem = _stem(key)
    with tempfile.TemporaryDirectory(dir=scratch, prefix=".shardq-verify-") as tmp:
        _, meta = _fetch_checked(target, stem, Path(tmp))
    return _info(stem, meta)


def restore(db_path: Path, target: Target, key: str, *, force: bool = False) -> BackupInfo:
    """Replace the database at `db_path` with backup `key`, after checking it.

    Raises `ServerRunning` if a server holds the database (unless `force`), and
    `BackupError` if the backup is missing, truncated or corrupt; the live file is then
    untouched.
    """
    stem = _stem(key)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        _server_lock(db_path, force),
        tempfile.TemporaryDirectory(dir=db_path.parent, prefix=".shardq-restore-") as tmp,
    ):
        candidate, meta = _fetch_checked(target, stem, Path(tmp))
        _swap_in(candidate, db_path)
    return _info(stem, meta)
