"""shardq's storage: the only package that touches SQLite (and PostgreSQL, with its extra).

`Store` owns one SQLite file (WAL mode). The writer process applies batches of the engine's
mutations to it, one transaction per batch; a recovering shard reads jobs and queue configs
back from it. Both are typed against `Storage` (`_contract`), the protocol every backend
meets, not against `Store`. Schema, migrations and every PRAGMA live in `_schema`. A shard
encodes its mutations for the writer with `MutationEncoder` (`_encode`), so the writer stores
records as the bytes that came.

Owns: the database's schema, migrations and settings (the SQLite file's PRAGMAs, or a PostgreSQL
database through `open_postgres`, the optional extra `postgres`: only it imports psycopg), and
every read and write of it.

Receives: batches of encoded mutations (`Storage.apply`, from the writer), recovery reads
(from a starting shard), `VACUUM INTO` snapshots (from `shardq.backup`), the idle
writer's vacuum steps, and `shardq storage copy`'s copy of a whole store into an empty one
(`_copy`, offline).

Sends: nothing over a socket: it returns the jobs and configs it read back, which rows of a
batch it rejected, and `StorageError`/`StorageFull` when the disk refuses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardq._lazy import lazy_exports

if TYPE_CHECKING:
    from shardq.storage._contract import Storage
    from shardq.storage._encode import MutationEncoder, describe, put_keys
    from shardq.storage._errors import StorageError, StorageFenced, StorageFull, StorageRejected
    from shardq.storage._modes import SYNCHRONOUS_MODES
    from shardq.storage._postgres import PostgresStore
    from shardq.storage._schema import SchemaInfo
    from shardq.storage._store import Store

__all__ = [
    "SYNCHRONOUS_MODES",
    "MutationEncoder",
    "SchemaInfo",
    "Storage",
    "StorageError",
    "StorageFenced",
    "StorageFull",
    "StorageRejected",
    "Store",
    "describe",
    "open_postgres",
    "put_keys",
]


def open_postgres(url: str, **options: Any) -> PostgresStore:
    """Open the PostgreSQL store at `url` (`PostgresStore.open`, its `options`).

    Raises `StorageError` naming the extra to install when psycopg is missing, and whatever
    `PostgresStore.open` raises.
    """
    from shardq.storage._errors import StorageError

    try:
        from shardq.storage._postgres import PostgresStore
    except ImportError as e:
        if not (e.name or "").startswith("psycopg"):
            raise
        raise StorageError(
            "PostgreSQL storage needs psycopg: pip install 'shardq[postgres]'"
        ) from e
    return PostgresStore.open(url, **options)


# Where each name lives, imported on first use: the errors (sqlite3 with them) are what the
# front end and the HTTP process need, the synchronous modes what the supervisor's config check
# needs, and the store, its encoder and schema (the engine with them) cost a process that
# never opens the database some 5 MB for good.
_HOME = {
    "Storage": "_contract",
    "MutationEncoder": "_encode",
    "describe": "_encode",
    "put_keys": "_encode",
    "StorageError": "_errors",
    "StorageFenced": "_errors",
    "StorageFull": "_errors",
    "StorageRejected": "_errors",
    "SYNCHRONOUS_MODES": "_modes",
    "SchemaInfo": "_schema",
    "Store": "_store",
}


__getattr__ = lazy_exports(__name__, _HOME, globals())
