"""A flush's commit, and the report of the mutations SQLite rejects (`Writer` inherits it).

`_commit` applies the buffer; when the store rejects its values (`StorageRejected`), the
mutations at fault are isolated (`_isolate.apply_isolating`) and the rest committed. Each
rejected mutation is logged, its batch marked refused (the front end gets no direct reply
for it), and its shard told with one `rejected` message per batch, each `upd` item carrying
the stored record for the shard's copy to take back (docs/runtime.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import structlog

from shardq.core import Mutation, job_id_of
from shardq.runtime import _messages as msgs
from shardq.runtime.writer._flush import FlushBuffer, Outgoing
from shardq.runtime.writer._isolate import apply_isolating
from shardq.storage import Storage, StorageError, StorageRejected, describe, put_keys

__all__ = ["RejectedMutations"]

_JOB_KINDS = frozenset({"put", "upd", "del"})

log = structlog.get_logger()


class RejectedMutations:
    """`_commit` and the `rejected` reports, over the writer's store, buffer and links."""

    _store: Storage
    _buffer: FlushBuffer
    _refused: set[tuple[int, int]]
    _send: Callable[[Sequence[Outgoing]], None]

    def _commit(self, mutations: list[Mutation]) -> int:
        """Apply the buffer; if SQLite rejects its values, commit all but the mutations at
        fault and report those (`rejected`, before the `done` that covers their batch).
        Raises a transient `StorageError` (the caller retries the whole buffer)."""
        try:
            return self._store.apply(mutations)
        except StorageRejected as e:
            log.warning("batch rejected; isolating the mutations at fault", error=str(e))
            rows, found = apply_isolating(self._store.apply, mutations, e)
        self._send(self._rejections(mutations, found))
        return rows

    def _rejections(
        self, mutations: list[Mutation], found: list[tuple[int, StorageRejected]]
    ) -> list[Outgoing]:
        """Log each rejected mutation; return one `rejected` message per batch concerned."""
        by_batch: dict[tuple[int, int], list[list[Any]]] = {}
        for index, error in found:
            shard, seq, current = self._buffer.owner(index)
            self._refused.add((shard, seq))
            kind, key = describe(mutations[index])
            log.error(
                "mutation rejected",
                shard=shard,
                seq=seq,
                kind=kind,
                job_id=job_id_of(key) if key and kind in _JOB_KINDS else None,
                key=key,
                error=str(error),
            )
            if current:
                by_batch.setdefault((shard, seq), []).extend(
                    self._rejected_items(mutations[index], kind, key, str(error))
                )
        return [(shard, msgs.rejected(seq, items)) for (shard, seq), items in by_batch.items()]

    def _rejected_items(
        self, mutation: Mutation, kind: str, key: str | None, error: str
    ) -> list[list[Any]]:
        """The `rejected` items of one mutation: one per job of an `updm` or a `putm`
        (`_encode`)."""
        keys: list[Any] = [key]
        if mutation[0] == "updm" and len(mutation) == 4 and isinstance(mutation[3], list):
            keys = [k for k in mutation[3] if isinstance(k, str)]
        elif mutation[0] == "putm":
            keys = put_keys(mutation) or keys
        items: list[list[Any]] = []
        for one in keys:
            item: list[Any] = [kind, one, error]
            if kind == "upd" and one is not None:
                # The shard's copy of the job holds changes the disk never will: it
                # takes the stored record back (None if the job is not stored).
                item.append(self._stored(one))
            items.append(item)
        return items

    def _stored(self, row_key: str) -> Any:
        try:
            return self._store.get_job(row_key)
        except StorageError as e:
            log.warning("cannot read a rejected job back", key=row_key, error=str(e))
            return None
