"""Backup settings, read from the environment with bunqueue's names.

    S3_BACKUP_ENABLED=1            scheduled snapshots on (the server takes them)
    S3_BUCKET, S3_REGION           where to (S3_ENDPOINT for MinIO, R2 or a local test server)
    S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY
    S3_BACKUP_INTERVAL=21600000    ms between snapshots (6 hours)
    S3_BACKUP_RETENTION=7          snapshots kept; the oldest are deleted after each one
    S3_PREFIX=shardq-backups/      key prefix (shardq's own)
    SHARDQ_BACKUP_DIR=/path        a local directory instead of S3 (shardq's own)

`SHARDQ_BACKUP_DIR` wins when both a directory and a bucket are set: it is the more explicit
choice on one machine. Secrets are read here and never logged or put in a repr.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = ["DEFAULT_INTERVAL_MS", "DEFAULT_RETENTION", "BackupSettings"]

DEFAULT_INTERVAL_MS: Final = 6 * 3600 * 1000  # bunqueue's default: a 6-hour recovery point
DEFAULT_RETENTION: Final = 7
_TRUE: Final = ("1", "true", "yes", "on")


def _int_setting(env: Mapping[str, str], name: str, default: int, low: int) -> int:
    raw = env.get(name, "").split("#", 1)[0].strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    return value


@dataclass(frozen=True)
class BackupSettings:
    """Where backups go and how often the server takes them."""

    enabled: bool = False
    directory: str | None = None
    bucket: str | None = None
    prefix: str = "shardq-backups/"
    region: str | None = None
    endpoint: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    interval_ms: int = DEFAULT_INTERVAL_MS
    retention: int = DEFAULT_RETENTION

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BackupSettings:
        """Read the settings; raises `ValueError` naming a bad variable, or when backups
        are enabled with no destination."""
        env = os.environ if env is None else env
        settings = cls(
            enabled=env.get("S3_BACKUP_ENABLED", "").strip().lower() in _TRUE,
            directory=env.get("SHARDQ_BACKUP_DIR") or None,
            bucket=env.get("S3_BUCKET") or None,
            prefix=env.get("S3_PREFIX", "shardq-backups/"),
            region=env.get("S3_REGION") or None,
            endpoint=env.get("S3_ENDPOINT") or None,
            access_key_id=env.get("S3_ACCESS_KEY_ID") or None,
            secret_access_key=env.get("S3_SECRET_ACCESS_KEY") or None,
            interval_ms=_int_setting(env, "S3_BACKUP_INTERVAL", DEFAULT_INTERVAL_MS, 1000),
            retention=_int_setting(env, "S3_BACKUP_RETENTION", DEFAULT_RETENTION, 1),
        )
        if settings.enabled and not settings.configured:
            raise ValueError("S3_BACKUP_ENABLED is set but neither S3_BUCKET nor SHARDQ_BACKUP_DIR")
        return settings

    @property
    def configured(self) -> bool:
        """True if a destination is set (backups can be taken, scheduled or not)."""
        return bool(self.directory or self.bucket)

    @property
    def destination(self) -> str:
        """Where backups go, for messages: a directory or `s3://bucket/prefix`."""
        if self.directory:
            return self.directory
        return f"s3://{self.bucket}/{self.prefix}" if self.bucket else "(none)"
