"""Bounds for the fields of every command, checked once before the engine acts on it.

Why these bounds: every integer the engine keeps is stored in SQLite (a signed 64-bit column),
packed with msgpack, or becomes a deadline the shard's poll waits on. A value outside those
ranges, or one that grows outside them through the engine's own arithmetic (a `timestamp` plus
a `delay`, `now` plus a `lockTtl`, a `dedup.ttl` or a DLQ `maxAge`), raised far from the request
that carried it: in the writer, which retried the batch forever, or in the shard's loop, which
exited. So a time is at most `MAX_TIMESTAMP_MS`, a duration at most `MAX_DURATION_MS`, a count
at most `MAX_COUNT`; their sums stay far below 2^63. Nothing is clamped: a value out of range is
refused with `Invalid <field>: <why>` and the command changes nothing.

Fields bunqueue itself validates on a push (`priority`, `delay`, `ttl`, ...) keep bunqueue's
wording (`_options.job_options_error`); `validate_job` adds the push fields bunqueue stores
unchecked (`timestamp`, `dedup.ttl`, `stackTraceLimit`, ...); the push handlers run it once per
job. `check_fields` covers the other commands from the one declaration of their fields
(`shardq/protocol/_commands.py`): the engine puts it in front of the handler of each command
the schema declares fields for (`command_check`, bound into the engine's registry), so it runs
once per command.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

from shardq.protocol._fields import MAX_DURATION_MS, MAX_SAFE_INTEGER, MAX_TIMESTAMP_MS, Limits
from shardq.protocol._schema import REGISTRY, Command, checker

from ._options import (
    CHECKED_FIELDS,
    check_number,
    is_number,
    job_options_error,
    validate_data,
)

__all__ = [
    "JOB_FIELDS",
    "MAX_COUNT",
    "MAX_DURATION_MS",
    "MAX_TIMESTAMP_MS",
    "check_fields",
    "command_check",
    "fields_checker",
    "job_extra_error",
    "validate_job",
]

MAX_COUNT: Final = MAX_SAFE_INTEGER
"""Counts, limits and offsets: the schema's bound (shardq/protocol/_fields.py)."""
_MAX_QUEUE_CHARS: Final = 256  # bunqueue's queue-name bound

Error: TypeAlias = str | None
Check: TypeAlias = Callable[[object, str, int], Error]


def _number(value: object, field: str, lo: int, hi: int, integral: bool) -> Error:
    if not is_number(value):
        return f"Invalid {field}: must be a number"
    if not math.isfinite(value):
        return f"Invalid {field}: must be a finite number"
    if integral and value != int(value):
        return f"Invalid {field}: must be an integer"
    if value < lo:
        return f"Invalid {field}: must be at least {lo}"
    if value > hi:
        return f"Invalid {field}: must be at most {hi}"
    return None


def duration(value: object, field: str, max_chars: int = 0) -> Error:
    """An optional span of milliseconds: 0 to `MAX_DURATION_MS`."""
    return None if value is None else _number(value, field, 0, MAX_DURATION_MS, False)


def timestamp(value: object, field: str, max_chars: int = 0) -> Error:
    """An optional wall-clock time in milliseconds: 0 to `MAX_TIMESTAMP_MS`."""
    return None if value is None else _number(value, field, 0, MAX_TIMESTAMP_MS, False)


def count(value: object, field: str, max_chars: int = 0) -> Error:
    """An optional non-negative integer: a count, a limit or an offset."""
    return None if value is None else _number(value, field, 0, MAX_COUNT, True)


def text(value: object, field: str, max_chars: int) -> Error:
    """An optional string of at most `max_chars` characters (a key)."""
    if value is None:
        return None
    if not isinstance(value, str):
        return f"Invalid {field}: must be a string"
    if len(value) > max_chars:
        return f"Invalid {field}: must be at most {max_chars} characters"
    return None


def ident(value: object, field: str, max_chars: int) -> Error:
    """An optional job id as clients send it: a string, or a finite number."""
    if is_number(value):
        return None if math.isfinite(value) else f"Invalid {field}: must be a finite number"
    return text(value, field, max_chars)


def flag(value: object, field: str, max_chars: int = 0) -> Error:
    """An optional flag. Numbers and maps pass (BullMQ spells `removeOnComplete` as a count or
    `{age, count}`); only their truth is used, so a list or a string is the only mistake."""
    if type(value) is bool or value is None:
        return None
    if isinstance(value, Mapping) or is_number(value):
        return None
    return f"Invalid {field}: must be a boolean"


def _idents(value: object, field: str, max_chars: int) -> Error:
    if not isinstance(value, list | tuple):
        return None  # `_options` reports "<field> must be an array" in bunqueue's words
    for item in value:
        error = ident(item, f"{field} entry", max_chars)
        if error:
            return error
    return None


def _queue(value: object, field: str, max_chars: int = 0) -> Error:
    """A queue the command may create: a string, as long as a pushable queue name may be."""
    if not isinstance(value, str):
        return "Queue name is required"
    if len(value) > _MAX_QUEUE_CHARS:
        return f"Queue name too long (max {_MAX_QUEUE_CHARS} characters)"
    return None


def _dedup(value: object, field: str, max_chars: int) -> Error:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return f"Invalid {field}: must be an object"
    return duration(value.get("ttl"), f"{field}.ttl")


def _priority(value: object, field: str, max_chars: int = 0) -> Error:
    # The bound a push gets, in bunqueue's words: the column it lands in is a 64-bit integer.
    # A priority that is no number at all keeps bunqueue's "Job not found or not in queue".
    return check_number(value, field, -1_000_000, 1_000_000) if is_number(value) else None


def _data(value: object, field: str, max_chars: int = 0) -> Error:
    return validate_data(value)


_FLAGS: Final = (
    "lifo",
    "durable",
    "removeOnComplete",
    "removeOnFail",
    "failParentOnFailure",
    "removeDependencyOnFailure",
    "continueParentOnFailure",
    "ignoreDependencyOnFailure",
)
# The push fields bunqueue stores without checking them, with their checks.
JOB_EXTRA_CHECKS: Final[dict[str, Check]] = {
    "timestamp": timestamp,
    "jobId": ident,
    "customId": ident,
    "uniqueKey": text,
    "dedup": _dedup,
    "debounceId": text,
    "debounceTtl": duration,
    "stackTraceLimit": count,
    "keepLogs": count,
    "sizeLimit": count,
    "dependsOn": _idents,
    "tags": _idents,
    **dict.fromkeys(_FLAGS, flag),
}
JOB_EXTRA_FIELDS: Final = frozenset(JOB_EXTRA_CHECKS)


def job_extra_error(fields: Mapping[str, Any], max_chars: int) -> Error:
    """The first of one job's extra push fields that is out of bounds, or None."""
    checks = JOB_EXTRA_CHECKS
    for name, value in fields.items():
        # Absent and null options are the common case, and every check passes None.
        if value is not None and name in checks:
            error = checks[name](value, name, max_chars)
            if error:
                return error
    return None


JOB_FIELDS: Final = CHECKED_FIELDS | JOB_EXTRA_FIELDS
"""The push fields `validate_job` checks beyond `data`."""


def validate_job(fields: Mapping[str, Any], max_chars: int) -> Error:
    """The first thing wrong with one job's push fields, or None: bunqueue's checks in its
    words, then the bounds of the fields bunqueue does not check. A job that is just its
    `data` (the common PUSHB entry) costs one set test beyond the data check."""
    error = validate_data(fields.get("data"))
    if error or JOB_FIELDS.isdisjoint(fields):
        return error
    return job_options_error(fields) or job_extra_error(fields, max_chars)


# The checks in bunqueue's own words that the schema's generic ones leave to the engine.
_WORDED_CHECKS: Final[dict[str, tuple[tuple[str, Check], ...]]] = {
    "ChangePriority": (("priority", _priority),),
    "Update": (("data", _data),),
}
# Commands whose queue the engine would create (or name "None") if it were missing.
_QUEUE_REQUIRED: Final = frozenset(
    name
    for name, command in REGISTRY.items()
    if any(f.kind == "queue" and f.required and not f.worded for f in command.fields)
)


def limits_of(max_key_chars: int, max_text_chars: int, max_list_items: int) -> Limits:
    return Limits(key_chars=max_key_chars, text_chars=max_text_chars, list_items=max_list_items)


def check_fields(name: str, cmd: Mapping[str, Any], limits: Limits | int) -> Error:
    """The first field of command `name` that is out of bounds, or None: the schema's
    declaration (shardq/protocol/_commands.py), then the few checks in bunqueue's words.
    Only for commands `command_check` gives a check; absent optional fields pass."""
    if isinstance(limits, int):
        limits = Limits(key_chars=limits)
    return fields_checker(name, limits)(cmd)


def command_check(command: Command, limits: Limits) -> Callable[[Mapping[str, Any]], Error] | None:
    """The field check of `command` (its schema entry), or None when it has none to run: no
    declared fields, or a push, whose jobs the handler checks itself (`validate_job`)."""
    if not command.checked or command.job:
        return None
    return fields_checker(command.name, limits)


def fields_checker(name: str, limits: Limits) -> Callable[[Mapping[str, Any]], Error]:
    """`check_fields` for command `name` with its declaration looked up once: the engine
    binds one to each handler, so a command pays only for its own fields."""
    queue_required = name in _QUEUE_REQUIRED
    worded = _WORDED_CHECKS.get(name, ())
    schema = checker(name, limits)
    if not queue_required and not worded:
        return schema
    key_chars = limits.key_chars

    def check(cmd: Mapping[str, Any]) -> Error:
        if queue_required and not isinstance(cmd.get("queue"), str):
            return "Queue name is required"
        for field, worded_check in worded:
            if field in cmd:
                error = worded_check(cmd.get(field), field, key_chars)
                if error:
                    return error
        return schema(cmd)

    return check
