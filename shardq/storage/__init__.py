"""shardq's storage: the only package that touches SQLite.

`Store` owns one SQLite file (WAL mode). The writer process applies batches of the engine's
mutations to it, one transaction per batch; a recovering shard reads jobs and queue configs
back from it. Both are typed against `Storage` (`_contract`), the protocol every backend
meets, not against `Store`. Schema, migrations and every PRAGMA live in `_schema`. A shard
encodes its mutations for the writer with `MutationEncoder` (`_encode`), so the writer stores
records as the bytes that came.
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
