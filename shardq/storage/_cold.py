"""The columns of a cold job: `cold`, `lifo`, `gid`, `ukey`, `made`, set for cold rows only.

A shard that keeps only the head of each queue in memory pages the rest in from storage
(`_cold_reads`), in the engine's delivery order, and looks cold jobs up by uniqueKey. That
order also reads whether a job is LIFO and its `groupId`, the lookup its `uniqueKey`, and the
queue-wide reads (GetJobs' order, Clean's age) its `createdAt`, which live in the record only
(`made` since schema version 11 of SQLite, 8 of PostgreSQL). The engine marks a job it does not
keep in memory with `"cold": 1` in its record (on its `put`, or in an `upd` when it evicts a
held job), and only such a row carries these columns and enters the cold indexes; every other
row leaves them NULL (but `made`, which a hot put leaves as it was: no index reads it on a row
not cold). A hot push so binds nothing more than before and enters no cold index, and the
writer never decodes a record on its hot path.

The columns follow the record as stored (`rec` with `patch` merged): `cold` is 1 when the
record's `cold` field is true, and then `lifo`, `gid`, `ukey` and `made` hold its `lifo` (0 or
1), `groupId`, `uniqueKey` and `createdAt` (0 if absent); otherwise they are NULL. A job's
`createdAt` never changes after its push, so no change map needs to name it. The engine never
clears `cold`, so a cold job stays cold on disk after it is paged in (a put of its record keeps
the field).

How each write keeps that true without decoding the usual row:

- A shard's encoder (`_encode`) sends a cold record's four fields beside its bytes, read from
  the record it holds as a dict: the writer binds them.
- A change map that names `cold`, `lifo`, `groupId` or `uniqueKey` carries `COLD_COLUMN` among
  its column fields (`cold_mark`): 1 if it sets `cold` true, else 0. The writer then reads the
  row back after the batch's updates and sets the four columns from the merged record
  (`cold_state`): every row for a 1, only the rows already cold for a 0. Evictions and the
  rare change of those fields on a cold row pay that read; no other update does.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.storage._deltas import DELTA_KEY

__all__ = [
    "COLD_COLUMN",
    "COLD_FIELDS",
    "COLD_KEYS",
    "HOT",
    "MADE_FIELD",
    "REFILL",
    "ColdState",
    "cold_mark",
    "cold_of",
    "cold_state",
]

COLD_COLUMN: Final = "cold"
"""The record field that marks a cold job, and the column that holds it."""
COLD_FIELDS: Final[dict[str, str]] = {"lifo": "lifo", "groupId": "gid", "uniqueKey": "ukey"}
"""Record field -> column, for the fields a cold row also keeps in columns and a change may
name (`createdAt`, kept in `made`, never changes)."""
MADE_FIELD: Final = "createdAt"
"""The record field a cold row keeps in its `made` column."""
COLD_KEYS: Final = frozenset((COLD_COLUMN, *COLD_FIELDS))
"""The fields a change map must name for the writer to look at the cold columns."""
_MARKED: Final = COLD_KEYS
_READ: Final = COLD_KEYS | {MADE_FIELD}

ColdState = tuple[int | None, int | None, str | None, str | None, int | None]
"""A row's (`cold`, `lifo`, `gid`, `ukey`, `made`)."""
HOT: Final[ColdState] = (None, None, None, None, None)

REFILL: Final = "refill"
"""In a put row's column values, in place of the cold fields: set them from the merged record
when the row is written (a change after the put in the batch named one of them)."""

_FRAME: Final = 4
_read_frame = struct.Struct(">I").unpack_from


def cold_of(rec: Mapping[str, Any]) -> list[Any]:
    """[lifo, gid, ukey, made] of a cold record held as a dict (a shard's encoder, on cold
    puts)."""
    gid, ukey, made = rec.get("groupId"), rec.get("uniqueKey"), rec.get(MADE_FIELD)
    return [
        1 if rec.get("lifo") else 0,
        gid if type(gid) is str else None,
        ukey if type(ukey) is str else None,
        made if type(made) is int else 0,
    ]


def cold_mark(changes: Mapping[str, Any]) -> int | None:
    """What a change map's column fields hold under `COLD_COLUMN`: None (the usual change,
    which names no cold field: nothing to do), 1 if it sets `cold` true, else 0."""
    if _MARKED.isdisjoint(changes):
        return None
    return 1 if changes.get(COLD_COLUMN) else 0


def cold_state(rec: bytes | Mapping[str, Any], patch: bytes) -> ColdState:
    """The four columns of a row whose record is `rec` (encoded or not) with `patch` merged
    in. A record or patch that cannot be decoded yields what could be read (recovery reports
    the corruption; the row is then treated as its readable fields say)."""
    fields: dict[str, Any] = {}
    decoded: Any = rec
    if type(rec) is bytes:
        try:
            decoded = _decode(rec)
        except (ValueError, msgpack.UnpackException):
            decoded = None
    if isinstance(decoded, Mapping):
        fields.update((k, decoded[k]) for k in _READ if k in decoded)
    if patch:
        fields.update(_changed(patch))
    if not fields.get(COLD_COLUMN):
        return HOT
    lifo, gid, ukey, made = cold_of(fields)
    return (1, lifo, gid, ukey, made)


def _changed(patch: bytes) -> dict[str, Any]:
    """The cold fields the change maps of `patch` set, the last one winning. Stops at a
    corrupt entry; skips delta ops (they never touch these fields)."""
    fields: dict[str, Any] = {}
    pos, end = 0, len(patch)
    while pos + _FRAME <= end:
        (size,) = _read_frame(patch, pos)
        start, pos = pos + _FRAME, pos + _FRAME + size
        if pos > end:
            break
        try:
            changes = _decode(patch[start:pos])
        except (ValueError, msgpack.UnpackException):
            break
        if isinstance(changes, dict) and DELTA_KEY not in changes:
            fields.update((k, changes[k]) for k in _READ if k in changes)
    return fields


def _decode(blob: bytes) -> Any:
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)
