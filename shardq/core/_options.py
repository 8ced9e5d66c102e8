"""Validation of push input, with bunqueue's exact error strings.

The bounds are those of bunqueue 2.9.5 (`src/infrastructure/server/protocol/validation.ts`),
because bunqueue's SDKs and tests match on the messages. Integers may arrive as floats: the
official clients send every integer outside int32 as float64.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final, TypeGuard

from shardq.protocol._fields import MAX_NESTING, too_deep

__all__ = [
    "CHECKED_FIELDS",
    "MAX_DATA_CHARS",
    "MAX_NESTING",
    "as_int",
    "certainly_small",
    "check_number",
    "job_options_error",
    "too_deep",
    "validate_data",
    "validate_name",
    "validate_queue_name",
]

_DAY_MS: Final = 24 * 60 * 60 * 1000
# bunqueue measures JSON.stringify(data).length against 10 MiB.
MAX_DATA_CHARS: Final = 10 * 1024 * 1024
_MAX_SAFE_INTEGER: Final = 2**53 - 1
_MAX_GROUP_PRIORITY: Final = 2_097_151
_QUEUE_NAME: Final = re.compile(r"^[a-zA-Z0-9_\-.:]+$")
_INTEGER_FIELDS: Final = frozenset({"priority", "attempts", "maxAttempts"})

# (field, min, max) checked in this order, as bunqueue does.
_BOUNDS: Final[tuple[tuple[str, int, int], ...]] = (
    ("delay", 0, 365 * _DAY_MS),
    ("timeout", 0, _DAY_MS),
    ("maxAttempts", 1, 1000),
)
_TTL_BOUNDS: Final[tuple[tuple[str, int, int], ...]] = (
    ("ttl", 0, 365 * _DAY_MS),
    ("stallTimeout", 0, _DAY_MS),
)


def is_number(value: object) -> TypeGuard[int | float]:
    kind = type(value)
    return kind is int or kind is float or (kind is not bool and isinstance(value, int | float))


def as_int(value: object, default: int) -> int:
    """An integer field that may arrive as a float; `default` when absent or not a number."""
    if is_number(value) and math.isfinite(value):
        return int(value)
    return default


def check_number(
    value: object, name: str, lo: float = 0, hi: float = _MAX_SAFE_INTEGER, required: bool = False
) -> str | None:
    """The bunqueue message for a bad numeric field, or None when it is acceptable."""
    if value is None:
        return f"{name} is required" if required else None
    if not is_number(value):
        return f"{name} must be a number"
    number = value
    if not math.isfinite(number):
        return f"{name} must be a finite number"
    if name in _INTEGER_FIELDS and number != int(number):
        return f"{name} must be an integer"
    if number < lo:
        return f"{name} must be at least {_fmt(lo)}"
    if number > hi:
        return f"{name} must be at most {_fmt(hi)}"
    return None


def _fmt(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else str(bound)


def validate_queue_name(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "Queue name is required"
    if len(name) > 256:
        return "Queue name too long (max 256 characters)"
    if not _QUEUE_NAME.match(name):
        return "Queue name contains invalid characters"
    return None


def _json_default(value: object) -> object:
    if isinstance(value, bytes | bytearray | memoryview):
        return list(bytes(value))
    raise TypeError(type(value).__name__)


_ATOMIC: Final = frozenset({int, float, bool, type(None)})
# A payload this small cannot approach MAX_DATA_CHARS, whatever escaping JSON adds (at most 6
# characters per character of a string): at most _SMALL_ITEMS values in all (those of the map
# and of the lists and maps one level down), no string longer than _SMALL_CHARS.
_SMALL_ITEMS: Final = 64
_SMALL_CHARS: Final = 4096


def _small_value(value: object) -> bool:
    kind = type(value)
    if kind is str:
        return len(value) <= _SMALL_CHARS  # type: ignore[arg-type]
    return kind in _ATOMIC


def _flat(container: list[Any] | dict[Any, Any]) -> bool:
    """A list or a map of plain values (one level, no containers)."""
    if isinstance(container, list):
        return all(map(_small_value, container))
    for key, value in container.items():
        if type(key) is not str or len(key) > _SMALL_CHARS or not _small_value(value):
            return False
    return True


def certainly_small(data: object) -> bool:
    """True for a payload of plain values, far under the cap: no need to serialise it. A map
    of plain values, or of lists and maps of plain values (a task call's `{"args": [...],
    "kwargs": {...}}`)."""
    kind = type(data)
    if kind is not dict:  # a map is the common payload: tested first
        if kind is str:
            return len(data) <= _SMALL_CHARS  # type: ignore[arg-type]
        return kind in _ATOMIC
    budget = _SMALL_ITEMS - len(data)  # type: ignore[arg-type]
    if budget < 0:
        return False
    for key, value in data.items():  # type: ignore[attr-defined]
        if type(key) is not str or len(key) > _SMALL_CHARS:
            return False
        vkind = type(value)
        if vkind is str:
            if len(value) > _SMALL_CHARS:
                return False
        elif vkind is list or vkind is dict:
            budget -= len(value)
            if budget < 0 or not _flat(value):
                return False
        elif vkind not in _ATOMIC:
            return False
    return True


def validate_data(data: object) -> str | None:
    if certainly_small(data):
        return None
    if too_deep(data):
        return "Invalid data: nested too deeply"
    try:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=_json_default)
    except (TypeError, ValueError):
        return "Job data must be JSON serializable"
    except RecursionError:  # `too_deep` keeps it away; this is the backstop
        return "Invalid data: nested too deeply"
    if len(text) > MAX_DATA_CHARS:
        return "Job data too large (max 10MB)"
    return None


def _validate_group_id(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return "groupId must be a string"
    if not value:
        return "groupId must be a non-empty string"
    if len(value) > 256:
        return "groupId must be at most 256 characters"
    if "\0" in value:
        return "groupId must not contain NUL characters"
    return None


def _validate_group_priority(value: object) -> str | None:
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value):
        return "group.priority must be a finite number"
    if value != int(value):
        return "group.priority must be an integer"
    if not 0 <= value <= _MAX_GROUP_PRIORITY:
        return f"group.priority must be between 0 and {_MAX_GROUP_PRIORITY}"
    return None


def _validate_backoff(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        if value.get("type") not in ("fixed", "exponential"):
            return "backoff.type must be 'fixed' or 'exponential'"
        error = check_number(value.get("delay"), "backoff.delay", 0, _DAY_MS, required=True)
        if error is None and value.get("maxDelay") is not None:
            error = check_number(value.get("maxDelay"), "backoff.maxDelay", 0, 86_400_000)
        return error
    return check_number(value, "backoff", 0, _DAY_MS)


def validate_name(fields: Mapping[str, Any]) -> str | None:
    if "name" not in fields or fields["name"] is None:
        return None
    name = fields["name"]
    if not isinstance(name, str) or not name or len(name) > 256:
        return "Job name must be a non-empty string of at most 256 characters"
    return None


def _validate_options(fields: Mapping[str, Any]) -> str | None:
    if fields.get("groupId") is None:
        error = check_number(fields.get("priority"), "priority", -1_000_000, 1_000_000)
    else:
        error = _validate_group_priority(fields.get("priority"))
    if error:
        return error
    for name, lo, hi in _BOUNDS:
        error = check_number(fields.get(name), name, lo, hi)
        if error:
            return error
    error = _validate_backoff(fields.get("backoff"))
    if error:
        return error
    for name, lo, hi in _TTL_BOUNDS:
        error = check_number(fields.get(name), name, lo, hi)
        if error:
            return error
    return None


def _validate_lists(fields: Mapping[str, Any]) -> str | None:
    for name in ("dependsOn", "childrenIds", "tags"):
        value = fields.get(name)
        if value is not None and not isinstance(value, list | tuple):
            return f"{name} must be an array"
    return None


CHECKED_FIELDS: Final = frozenset(
    ("name", "groupId", "priority", "backoff", "dependsOn", "childrenIds", "tags")
).union(field for field, _, _ in (*_BOUNDS, *_TTL_BOUNDS))


def job_options_error(fields: Mapping[str, Any]) -> str | None:
    """The first of one job's options bunqueue checks that is wrong, in its words, or None."""
    return (
        validate_name(fields)
        or _validate_group_id(fields.get("groupId"))
        or _validate_options(fields)
        or _validate_lists(fields)
    )
