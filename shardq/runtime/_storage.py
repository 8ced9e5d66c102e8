"""Opening the storage a server is configured with: the SQLite file, or PostgreSQL.

The writer and each recovering shard open the backend here and use it only through the
`Storage` contract. `storage_url` set means PostgreSQL (docs/postgres.md); empty, the SQLite
file at `data_path` with the writer's SQLite settings, as always.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from shardq.runtime._spec import ChildSpec
from shardq.storage import Storage, Store, open_postgres
from shardq.storage._rebuild import hold_shared

if TYPE_CHECKING:
    from shardq.storage._postgres import PostgresStore

__all__ = ["BEAT_EVERY_S", "ROW_CACHE_ENTRY_BYTES", "every", "open_storage", "storage_place"]

ROW_CACHE_ENTRY_BYTES: Final = 240
"""What one row summary of the writer's cache takes (`row_cache_mb`): its dict slot and
tuple (142 bytes, measured with tracemalloc over 100,000) and the job id it keeps alive."""

BEAT_EVERY_S: Final = 0.25
"""How often a child busy opening its store tells the supervisor it is alive: well inside
the shortest `ready_timeout_ms` (1 s)."""


def open_storage(
    spec: ChildSpec, *, capped: bool, progress: Callable[[], None] | None = None
) -> Storage:
    """Open (and migrate) the configured store. `capped`: apply `max_db_bytes` (the writer
    does; a shard only reads). `progress`: called now and then during SQLite's migrations
    (`Store.open`; PostgreSQL's run statements the client cannot interrupt, and it is not
    called). Raises `StorageError`."""
    settings = spec.writer
    rows = (settings.row_cache_mb << 20) // ROW_CACHE_ENTRY_BYTES
    store: Store | PostgresStore
    if settings.storage_url:
        store = open_postgres(settings.storage_url, cache_records=rows)
    else:
        # A shard's reads (`capped` False) keep the writer from swapping a rebuilt file in
        # under them while their connection is open (`storage._rebuild.hold_shared`).
        lock = None if capped else hold_shared(Path(spec.data_path))
        try:
            store = Store.open(
                spec.data_path,
                synchronous=settings.synchronous,
                cache_records=rows,
                max_bytes=(settings.max_db_bytes or None) if capped else None,
                cache_mb=settings.sqlite_cache_mb,
                mmap_mb=settings.sqlite_mmap_mb,
                progress=progress,
            )
        except BaseException:
            if lock is not None:
                os.close(lock)
            raise
        store.keep_swap_lock(lock)
    store.drain_chunk = settings.drain_chunk_rows
    return store


def every(beat: Callable[[], None], seconds: float) -> Callable[[], None]:
    """`beat`, called at most once per `seconds` (a cheap clock check otherwise): for a
    progress callback that SQLite may call hundreds of times a second."""
    due = time.monotonic()

    def throttled() -> None:
        nonlocal due
        now = time.monotonic()
        if now >= due:
            due = now + seconds
            beat()

    return throttled


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
