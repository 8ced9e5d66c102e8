"""A stored job record's keys and the defaults it leaves out (docs/runtime.md, "The stored
job record").

A record (`Job.to_record`) is a msgpack map. Of the 28 keys a job pushed without options has,
most hold their default for all its life (no start, no attempt, no log, no result ...), and
their names were most of its bytes. A record is therefore written without the keys of
`RECORD_DEFAULTS` whose value is exactly (type and value) their default (`drop_defaults`),
and every reader of a stored record puts them back first (`fill_record`): records written
before, which carry every key, read exactly as they did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "RECORD_DEFAULTS",
    "RECORD_TEMPLATE",
    "drop_defaults",
    "fill_record",
    "slim_record",
]

DEFAULT_MAX_ATTEMPTS: Final = 3

# The fields a job holds as attributes, in wire (and record) order.
HOT_KEYS: Final = (
    "id",
    "queue",
    "name",
    "data",
    "priority",
    "createdAt",
    "runAt",
    "startedAt",
    "completedAt",
    "attempts",
    "maxAttempts",
    "progress",
    "progressMessage",
    "stacktrace",
    "lastHeartbeat",
    "stallCount",
    "childrenCompleted",
    "lifo",
    "timeline",
)
# The engine's own fields of a record, after the hot ones.
ENGINE_KEYS: Final = (
    "state", "seq", "failedReason", "dlq", "dlqRetries", "logs", "logsAdded", "dedupUntil"
)  # fmt: skip
RECORD_TEMPLATE: Final[Mapping[str, Any]] = dict.fromkeys((*HOT_KEYS, *ENGINE_KEYS, "hasResult"))
"""Every key of the full record of a job without options, in order (`Job.to_record` writes
them in this order, without those holding their default)."""

RECORD_DEFAULTS: Final[Mapping[str, Any]] = {
    "name": "default", "priority": 0, "startedAt": None, "completedAt": None, "attempts": 0,
    "maxAttempts": DEFAULT_MAX_ATTEMPTS, "progress": 0, "progressMessage": None,
    "stacktrace": None, "stallCount": 0, "childrenCompleted": 0, "lifo": False,
    "timeline": [], "failedReason": None, "dlq": None, "dlqRetries": 0, "logs": None,
    "logsAdded": 0, "dedupUntil": None, "hasResult": False,
}  # fmt: skip
"""The record fields a stored record may leave out, and the value a missing one has. A
missing `hasResult` is whether the record holds a `returnvalue` (records written before
`hasResult` existed); `drop_defaults` keeps a false one beside a `returnvalue`."""
assert set(RECORD_DEFAULTS) <= set(RECORD_TEMPLATE), "only a record's own fields"
_ITEMS: Final = tuple(RECORD_DEFAULTS.items())
_NONE: Final = object()


def drop_defaults(rec: dict[str, Any]) -> dict[str, Any]:
    """`rec` itself, without the keys whose value is exactly their default (`0` is not
    `0.0` nor `False`: they pack differently and read back as themselves)."""
    for key, default in _ITEMS:
        value = rec.get(key, _NONE)
        if value is default or (type(value) is type(default) and value == default):
            del rec[key]
    if "returnvalue" in rec and "hasResult" not in rec:
        rec["hasResult"] = False  # a dropped result: the value is there, not a result
    return rec


def slim_record(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `rec` without the keys holding their default (`drop_defaults`)."""
    return drop_defaults(dict(rec))


def fill_record(rec: dict[str, Any]) -> dict[str, Any]:
    """`rec` itself (a stored record just decoded, or a copy), with every key it leaves out
    put back at its default (`RECORD_DEFAULTS`): what every reader of a stored record
    sees, whether it was written slim or, before, with every key."""
    if "hasResult" not in rec:
        rec["hasResult"] = "returnvalue" in rec
    for key, default in _ITEMS:
        if key not in rec:
            rec[key] = [] if key == "timeline" else default
    return rec
