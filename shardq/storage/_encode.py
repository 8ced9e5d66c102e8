"""Mutations as the writer takes them: records and changes already msgpack-encoded.

A shard must encode its mutations to send them anyway. `MutationEncoder` encodes each job
record and each change map on its own, and puts the few fields the writer needs for its
columns beside the bytes, so the writer stores the bytes as they came and never decodes a job:

    ("putb", row_key, queue, state, priority, run_at, seq, rec)  for ("put", rec)
    ("updb", row_key, changes, columns)                          for ("upd", row_key, changes)
    ("dltb", row_key, op)                                        for ("delta", row_key, op)

`rec` and `changes` are the msgpack encodings (`use_bin_type=True`) of the engine's record and
change map. `columns` holds the column fields the changes set, under their record names
(`queue`, `state`, `priority`, `runAt`, `seq`), and is usually `{"state": ...}`. "del",
"queue" and "qdel" are small and pass through unchanged, as does any mutation the encoder
cannot vouch for (a missing row key, a mistyped column field): the writer then rejects it with
the same error as before. A batch may mix both forms; `Store.apply` takes either.

The meaning is exactly that of the engine's shapes (`shardq.core._mutations`): `putb` is the
`put` of the record `rec` decodes to, `updb` the `upd` of those changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core._mutations import Mutation

__all__ = ["COLUMN_FIELDS", "MutationEncoder", "describe"]

COLUMN_FIELDS: Final[tuple[str, ...]] = ("queue", "state", "priority", "runAt", "seq")
"""The record fields that the `jobs` table also keeps in columns, for queries and recovery order."""

# Column fields that are NOT NULL in the table, and the type each must have.
_TYPED: Final[tuple[tuple[str, type], ...]] = (("queue", str), ("state", str), ("seq", int))


class MutationEncoder:
    """Turns the engine's mutations into the writer's encoded form. One per thread."""

    def __init__(self) -> None:
        self._pack = msgpack.Packer(use_bin_type=True).pack
        # Of the last `encode`: the summed length of the encoded mutations' keys and blobs,
        # and how many mutations were left as they were. A shard bounds its batches in bytes
        # from these without walking the batch again (`shardq.runtime.shard._batches`).
        self.encoded_bytes = 0
        self.unencoded = 0

    def encode(self, mutations: Iterable[Mutation]) -> list[Mutation]:
        """The batch with every well-formed `put` and `upd` encoded; the rest unchanged.

        Raises `TypeError` (from msgpack) for a value msgpack cannot encode, as packing the
        whole batch would.
        """
        pack = self._pack
        out: list[Mutation] = []
        append = out.append
        # Jobs moved together share one change map (a PULLB of 100 emits 100 `upd`s of one
        # payload, see `shardq.core._mutations`), so the last map's encoding is reused while
        # the same object comes again: one pack per batch instead of one per job.
        last: object = None
        last_enc: tuple[bytes, dict[str, Any]] | None = None
        size = unencoded = 0
        for m in mutations:
            kind = m[0] if m else None
            if kind == "upd" and len(m) == 3:
                key, changes = m[1], m[2]
                if type(key) is str:
                    if changes is not last:
                        last, last_enc = changes, _encode_changes(changes, pack)
                    if last_enc is not None:
                        append(("updb", key, *last_enc))
                        size += len(key) + len(last_enc[0])
                        continue
            elif kind == "delta" and len(m) == 3:
                if type(m[1]) is str and type(m[2]) is dict:
                    blob = pack(m[2])
                    append(("dltb", m[1], blob))
                    size += len(m[1]) + len(blob)
                    continue
            elif kind == "put" and len(m) == 2:
                rec = m[1]
                if type(rec) is dict:
                    key = rec.get("rowKey") or rec.get("id")
                    queue, state, seq = rec.get("queue"), rec.get("state"), rec.get("seq")
                    if (
                        type(key) is str
                        and type(queue) is str
                        and type(state) is str
                        and type(seq) is int
                    ):
                        priority, run_at = rec.get("priority"), rec.get("runAt")
                        blob = pack(rec)
                        append(("putb", key, queue, state, priority, run_at, seq, blob))
                        size += len(key) + len(blob)
                        continue
            append(m)
            unencoded += 1
        self.encoded_bytes, self.unencoded = size, unencoded
        return out


def _encode_changes(changes: object, pack: Any) -> tuple[bytes, dict[str, Any]] | None:
    """(encoded changes, their column fields), or None if they are no map or mistyped."""
    if type(changes) is not dict:
        return None
    columns = _columns_of(changes)
    if columns is None:
        return None
    return pack(changes), columns


def _columns_of(changes: dict[str, Any]) -> dict[str, Any] | None:
    """The column fields `changes` sets, or None if one of them is mistyped."""
    columns = {name: changes[name] for name in COLUMN_FIELDS if name in changes}
    for name, kind in _TYPED:
        if name in columns and type(columns[name]) is not kind:
            return None
    return columns


def describe(mutation: object) -> tuple[str, str | None]:
    """(kind, key) of a mutation in either shape: kind "put", "upd", "delta", "del", "queue"
    or "qdel"; key the job's row key (or the queue's name). Tolerates malformed mutations: a
    rejected one may be anything (kind "?" and key None when unrecognisable)."""
    if not isinstance(mutation, list | tuple) or not mutation:
        return "?", None
    kind: Any = mutation[0]
    key: Any = mutation[1] if len(mutation) > 1 else None
    if kind == "put" and isinstance(key, dict):
        key = key.get("rowKey") or key.get("id")
    kind = {"putb": "put", "updb": "upd", "dltb": "delta"}.get(kind, kind)
    return (
        kind if isinstance(kind, str) else "?",
        key if isinstance(key, str) else None,
    )
