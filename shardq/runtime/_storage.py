"""Opening the storage a server is configured with: the SQLite file, or PostgreSQL.

The writer and each recovering shard open the backend here and use it only through the
`Storage` contract. `storage_url` set means PostgreSQL (docs/postgres.md); empty, the SQLite
file at `data_path` with the writer's SQLite settings, as always.
"""

from __future__ import annotations

from shardq.runtime._spec import ChildSpec
from shardq.storage import Storage, Store, open_postgres

__all__ = ["open_storage", "storage_place"]


def open_storage(spec: ChildSpec, *, capped: bool) -> Storage:
    """Open (and migrate) the configured store. `capped`: apply `max_db_bytes` (the writer
    does; a shard only reads). Raises `StorageError`."""
    settings = spec.writer
    if settings.storage_url:
        return open_postgres(settings.storage_url)
    return Store.open(
        spec.data_path,
        synchronous=settings.synchronous,
        max_bytes=(settings.max_db_bytes or None) if capped else None,
        cache_mb=settings.sqlite_cache_mb,
        mmap_mb=settings.sqlite_mmap_mb,
    )


def storage_place(spec: ChildSpec) -> str:
    """Where the store is, for logs: the SQLite file, or the PostgreSQL URL without its
    password."""
    url = spec.writer.storage_url
    if not url:
        return spec.data_path
    scheme, _, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}{at}{host}" if at else url
