"""shardq's storage: the only package that touches SQLite.

`Store` owns one SQLite file (WAL mode). The writer process applies batches of the engine's
mutations to it, one transaction per batch; a recovering shard reads jobs and queue configs
back from it. Both are typed against `Storage` (`_contract`), the protocol every backend
meets, not against `Store`. Schema, migrations and every PRAGMA live in `_schema`. A shard
encodes its mutations for the writer with `MutationEncoder` (`_encode`), so the writer stores
records as the bytes that came.

Owns: the database file's schema, migrations and PRAGMAs, and every read and write of it.

Receives: batches of encoded mutations (`Storage.apply`, from the writer), recovery reads
(from a starting shard), `VACUUM INTO` snapshots (from `shardq.backup`).

Sends: nothing over a socket: it returns the jobs and configs it read back, which rows of a
batch it rejected, and `StorageError`/`StorageFull` when the disk refuses.
"""

from shardq.storage._contract import Storage
from shardq.storage._encode import MutationEncoder, describe
from shardq.storage._errors import StorageError, StorageFull, StorageRejected
from shardq.storage._schema import SYNCHRONOUS_MODES, SchemaInfo
from shardq.storage._store import Store

__all__ = [
    "SYNCHRONOUS_MODES",
    "MutationEncoder",
    "SchemaInfo",
    "Storage",
    "StorageError",
    "StorageFull",
    "StorageRejected",
    "Store",
    "describe",
]
