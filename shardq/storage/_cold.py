"""The columns that place a stored job in its queue's delivery order: `lifo`, `gid`, `ukey`.

A shard that keeps only the head of each queue in memory pages the rest in from storage
(`_cold_reads`), in the engine's delivery order, and looks cold jobs up by uniqueKey. The
`jobs` table kept the queue, state, priority, run_at and seq as columns already; what else
that order and those lookups read lives in the record only: whether the job is LIFO, its
`groupId` and its `uniqueKey`. These three columns hold them.

The writer stores records as the bytes a shard encoded and never decodes one on its hot
path, so it finds these fields without decoding: a record or a change that sets one of them
holds its key as a msgpack string (`\\xa4lifo`, `\\xa7groupId`, `\\xa9uniqueKey`), and a
LIFO record holds `\\xa4lifo\\xc3` (the key then true). A plain job's record has none of
those byte strings, and its row costs a few substring tests. A record or change that has
one (or a payload that happens to hold the same bytes) is decoded and its top-level fields
read: a false hit costs a decode, never a wrong column.

The columns follow the record as stored (`rec` with `patch` merged): a put sets them from its
record and the changes after it in the batch, an update of a stored job sets those its
changes name. Delta ops (`_deltas`) never touch these fields.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.storage._deltas import DELTA_KEY

__all__ = ["COLD_FIELDS", "RECORD_MARKS", "ColdValues", "cold_changes", "cold_values"]

COLD_FIELDS: Final[dict[str, str]] = {"lifo": "lifo", "groupId": "gid", "uniqueKey": "ukey"}
"""Record field -> column, for the fields these columns keep."""

ColdValues = tuple[int, str | None, str | None]
"""(lifo as 0 or 1, group id or None, uniqueKey or None): a row's `lifo`, `gid`, `ukey`."""

PLAIN: Final[ColdValues] = (0, None, None)

RECORD_MARKS: Final = (b"\xa4lifo\xc3", b"\xa7groupId", b"\xa9uniqueKey")
"""What a record (or a patch) holds if one of the columns may differ from a plain job's:
"lifo" only matters when true, the other two whenever present."""
# In a change: any mention (a change may set lifo back to false).
_CHANGE_MARKS: Final = (b"\xa4lifo", b"\xa7groupId", b"\xa9uniqueKey")
_FRAME: Final = 4
_read_frame = struct.Struct(">I").unpack_from


def cold_values(rec: bytes, patch: bytes) -> ColdValues:
    """The cold columns of a row whose record is `rec` with `patch` merged in. A record or
    patch that cannot be decoded yields what could be read (recovery reports corruption)."""
    if not _mentions(rec, RECORD_MARKS) and not (patch and _mentions(patch, _CHANGE_MARKS)):
        return PLAIN
    fields: dict[str, Any] = {}
    try:
        decoded = _decode(rec)
    except (ValueError, msgpack.UnpackException):
        decoded = None
    if isinstance(decoded, dict):
        fields.update((k, decoded.get(k)) for k in COLD_FIELDS if k in decoded)
    if patch:
        fields.update(_changed(patch))
    return _as_values(fields)


def cold_changes(patch: bytes) -> dict[str, Any]:
    """The cold columns (column name -> value) that the changes in `patch` set; empty for
    the usual change, which names none of their fields."""
    if not _mentions(patch, _CHANGE_MARKS):
        return {}
    fields = _changed(patch)
    lifo, gid, ukey = _as_values(fields)
    out: dict[str, Any] = {}
    if "lifo" in fields:
        out["lifo"] = lifo
    if "groupId" in fields:
        out["gid"] = gid
    if "uniqueKey" in fields:
        out["ukey"] = ukey
    return out


def _mentions(blob: bytes, marks: tuple[bytes, ...]) -> bool:
    return any(mark in blob for mark in marks)


def _changed(patch: bytes) -> dict[str, Any]:
    """The cold fields the change maps of `patch` set, the last one winning. Stops at a
    corrupt entry."""
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
            fields.update((k, changes[k]) for k in COLD_FIELDS if k in changes)
    return fields


def _as_values(fields: dict[str, Any]) -> ColdValues:
    gid, ukey = fields.get("groupId"), fields.get("uniqueKey")
    return (
        1 if fields.get("lifo") else 0,
        gid if isinstance(gid, str) else None,
        ukey if isinstance(ukey, str) else None,
    )


def _decode(blob: bytes) -> Any:
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)
