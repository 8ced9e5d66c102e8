"""Where backup files live: a local directory or an S3-compatible bucket, behind one interface.

A target stores whole objects under keys and lists them with sizes and times; it knows nothing
of what a backup is. A local `put` writes a temporary name and renames it, so a crash never
leaves a half-written object under its real name (S3 gives that guarantee itself).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol

from shardq.backup._settings import BackupSettings

__all__ = [
    "S3_MISSING",
    "LocalTarget",
    "ObjectInfo",
    "S3Target",
    "Target",
    "open_target",
    "require_boto3",
]


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: datetime


class Target(Protocol):
    def put(self, key: str, source: Path) -> None: ...
    def get(self, key: str, dest: Path) -> None: ...
    def list(self) -> list[ObjectInfo]: ...
    def delete(self, key: str) -> None: ...


class LocalTarget:
    """Objects as files in one directory (created on first use)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        if "/" in key or key.startswith("."):
            raise ValueError(f"bad backup key {key!r}")
        return self.directory / key

    def put(self, key: str, source: Path) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".put-")
        try:
            with os.fdopen(fd, "wb") as out, source.open("rb") as src:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self._path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str, dest: Path) -> None:
        path = self._path(key)
        if not path.exists():
            raise FileNotFoundError(f"no backup object {key} in {self.directory}")
        with path.open("rb") as src, dest.open("wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)

    def list(self) -> list[ObjectInfo]:
        if not self.directory.is_dir():
            return []
        return [
            ObjectInfo(p.name, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))
            for p in self.directory.iterdir()
            if p.is_file() and not p.name.startswith(".")
            for st in [p.stat()]
        ]

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class S3Target:
    """Objects in an S3-compatible bucket under a key prefix, through boto3."""

    def __init__(self, settings: BackupSettings) -> None:
        boto3 = require_boto3()

        self.bucket = str(settings.bucket)
        self.prefix = settings.prefix
        self._s3: Any = boto3.client(
            "s3",
            region_name=settings.region or "us-east-1",
            endpoint_url=settings.endpoint,
            aws_access_key_id=settings.access_key_id,
            aws_secret_access_key=settings.secret_access_key,
        )

    def put(self, key: str, source: Path) -> None:
        self._s3.upload_file(str(source), self.bucket, self.prefix + key)

    def get(self, key: str, dest: Path) -> None:
        self._s3.download_file(self.bucket, self.prefix + key, str(dest))

    def list(self) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix
        )
        for page in pages:
            for obj in page.get("Contents", []):
                key = str(obj["Key"])[len(self.prefix) :]
                if key and "/" not in key:
                    found.append(ObjectInfo(key, int(obj["Size"]), obj["LastModified"]))
        return found

    def delete(self, key: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=self.prefix + key)


S3_MISSING: Final = "S3 backups need boto3: pip install 'shardq[s3]'"


def require_boto3() -> Any:
    """boto3, imported on first use (only S3 users pay for it, and only they install it).
    Raises `ValueError` saying which extra to install when it is missing."""
    try:
        import boto3
    except ImportError:
        raise ValueError(S3_MISSING) from None
    return boto3


def open_target(settings: BackupSettings) -> Target:
    """The target the settings name. Raises `ValueError` when none is configured."""
    if settings.directory:
        return LocalTarget(Path(settings.directory))
    if settings.bucket:
        return S3Target(settings)
    raise ValueError("no backup destination: set SHARDQ_BACKUP_DIR, or S3_BUCKET and its keys")
