"""The kinds of field a command may carry, and the check of each: sans-IO, no state.

A `Field` says what one key of a command map holds (its kind, its range, its length) and the
names bunqueue's and BullMQ's clients also use for it. `field_error` checks one value against
it and answers `Invalid <field>: <why>`, or None. The ranges are chosen so that every later
computation stays in range: a time plus a duration stays below 2^63 (SQLite's integer, msgpack's
int64), a count stays exact as a JavaScript number, a container nests no deeper than a reply
that carries it can be packed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeGuard

__all__ = [
    "MAX_DURATION_MS",
    "MAX_NESTING",
    "MAX_SAFE_INTEGER",
    "MAX_TIMESTAMP_MS",
    "NUMERIC_KINDS",
    "Field",
    "Kind",
    "Limits",
    "field_error",
    "is_number",
    "overflow_error",
    "read_number",
    "schema_limits",
    "too_deep",
]

MAX_SAFE_INTEGER: Final = 2**53 - 1
"""Counts, limits and offsets: JavaScript's largest exact integer, what bunqueue's clients send."""
MAX_TIMESTAMP_MS: Final = 2**53 - 1
"""A wall-clock time in ms (about the year 287,000): plus any duration it stays under 2^63."""
MAX_DURATION_MS: Final = 4_320_000_000_000_000
"""bunqueue clamps durations at 4.32e15 ms; shardq refuses what bunqueue would clamp."""
MAX_NESTING: Final = 512
"""How deep lists and maps may nest in a stored or echoed value. msgpack decodes about 1,024
levels, and a stored value travels inside messages that add a few levels of their own."""

Kind = Literal[
    "int",  # an integer in [lo, hi]
    "count",  # a non-negative integer
    "number",  # a finite number in [lo, hi]
    "duration",  # milliseconds, 0 to MAX_DURATION_MS
    "time",  # an epoch time in ms, 0 to MAX_TIMESTAMP_MS
    "key",  # a string of at most `max_len` (default: the key limit) characters
    "text",  # a free text: a string (at most the text limit) or a scalar shown as text
    "id",  # a job id as clients send it: a string, or a finite number
    "bool",  # true or false
    "flag",  # a truth: a boolean, a number, or BullMQ's `{age, count}` map
    "list",  # a list of `item`s, at most `max_len` (default: the list limit)
    "map",  # an object, at most `max_len` keys (default: the map limit)
    "any",  # any value that nests no deeper than MAX_NESTING
    "queue",  # a queue name: a string of at most 256 characters
]
NUMERIC_KINDS: Final = frozenset({"int", "count", "number", "duration", "time"})
_INTEGRAL: Final = frozenset({"int", "count"})
_MAX_QUEUE_CHARS: Final = 256  # bunqueue's queue-name bound


@dataclass(frozen=True, slots=True)
class Limits:
    """The length limits of a deployment (`max_key_chars`, `max_text_chars`, ...)."""

    key_chars: int = 1_024
    text_chars: int = 1 << 20
    list_items: int = 10_000
    map_keys: int = 10_000


@dataclass(frozen=True, slots=True)
class Field:
    """One key of a command map. `worded`: the handler checks it in bunqueue's own words (a
    client matches on them), so the generic check leaves it alone and only documents it."""

    name: str
    kind: Kind
    doc: str = ""
    lo: float | None = None
    hi: float | None = None
    max_len: int | None = None
    required: bool = False
    aliases: tuple[str, ...] = ()
    item: Kind | None = None
    worded: bool = False

    def bounds(self) -> tuple[float, float]:
        """The numeric range of this field (its kind's when not given)."""
        lo, hi = _KIND_RANGE.get(self.kind, (-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER))
        return (lo if self.lo is None else self.lo), (hi if self.hi is None else self.hi)

    def describe(self, limits: Limits = Limits()) -> str:
        """The field's type and range in a few words, for the docs' tables."""
        if self.kind in NUMERIC_KINDS:
            lo, hi = self.bounds()
            word = "integer" if self.kind in _INTEGRAL else "number"
            return f"{word} {_fmt(lo)}..{_fmt(hi)}" + (" ms" if self.kind == "duration" else "")
        sizes = {
            "key": f"string ≤ {self.max_len or limits.key_chars} chars",
            "text": f"text ≤ {self.max_len or limits.text_chars} chars",
            "id": f"id (string ≤ {self.max_len or limits.key_chars} chars, or number)",
            "list": f"list ≤ {self.max_len or limits.list_items} items"
            + (f" of {self.item}" if self.item else ""),
            "map": f"map ≤ {self.max_len or limits.map_keys} keys",
            "queue": f"queue name ≤ {_MAX_QUEUE_CHARS} chars",
            "any": f"any value, nesting ≤ {MAX_NESTING}",
        }
        return sizes.get(self.kind, self.kind)


def schema_limits(engine: dict[str, int]) -> Limits:
    """The limits configured in a server's `[engine]` table (defaults for the keys not set)."""
    default = Limits()
    return Limits(
        key_chars=engine.get("max_key_chars", default.key_chars),
        text_chars=engine.get("max_text_chars", default.text_chars),
        list_items=engine.get("max_list_items", default.list_items),
    )


_KIND_RANGE: Final[dict[str, tuple[float, float]]] = {
    "int": (-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
    "count": (0, MAX_SAFE_INTEGER),
    "number": (-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
    "duration": (0, MAX_DURATION_MS),
    "time": (0, MAX_TIMESTAMP_MS),
}


def _fmt(bound: float) -> str:
    if bound == MAX_SAFE_INTEGER:
        return "2^53-1"
    if bound == -MAX_SAFE_INTEGER:
        return "-(2^53-1)"
    return str(int(bound)) if bound == int(bound) else str(bound)


def is_number(value: object) -> TypeGuard[int | float]:
    kind = type(value)
    return kind is int or kind is float or (kind is not bool and isinstance(value, int | float))


def read_number(value: str) -> float | int | None:
    """A numeric string as the number it spells (bunqueue 2.9.11 reads "5000" as 5000), or
    None. Only plain decimal: no hex, no underscores, no NaN or Infinity."""
    text = value.strip()
    if not text or len(text) > 40 or any(c not in "0123456789+-.eE" for c in text):
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    if not math.isfinite(number):
        return None
    return int(number) if number.is_integer() and abs(number) <= MAX_SAFE_INTEGER else number


def too_deep(value: object, limit: int = MAX_NESTING) -> bool:
    """Whether lists or maps nest more than `limit` levels deep in `value`. Walks only
    containers, without recursion; a scalar costs one type test."""
    kind = type(value)
    if kind is not dict and kind is not list and kind is not tuple:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if type(node) is dict else node:
            kind = type(child)
            if kind is dict or kind is list or kind is tuple:
                stack.append((child, depth + 1))
    return False


def _number_error(field: Field, value: object) -> str | None:
    if not is_number(value):
        return f"Invalid {field.name}: must be a number"
    if not math.isfinite(value):
        return f"Invalid {field.name}: must be a finite number"
    if field.kind in _INTEGRAL and value != int(value):
        return f"Invalid {field.name}: must be an integer"
    lo, hi = field.bounds()
    if value < lo:
        return f"Invalid {field.name}: must be at least {int(lo) if lo == int(lo) else lo}"
    if value > hi:
        return f"Invalid {field.name}: must be at most {int(hi) if hi == int(hi) else hi}"
    return None


def _string_error(name: str, value: object, max_chars: int) -> str | None:
    if not isinstance(value, str):
        return f"Invalid {name}: must be a string"
    if len(value) > max_chars:
        return f"Invalid {name}: must be at most {max_chars} characters"
    return None


def _list_error(field: Field, value: object, limits: Limits) -> str | None:
    if not isinstance(value, list | tuple):
        return f"Invalid {field.name}: must be an array"
    cap = field.max_len or limits.list_items
    if len(value) > cap:
        return f"Invalid {field.name}: must have at most {cap} items"
    if field.item is not None:
        entry = Field(f"{field.name} entry", field.item)
        for item in value:
            error = field_error(entry, item, limits)
            if error:
                return error
    elif too_deep(value):
        return f"Invalid {field.name}: nested too deeply"
    return None


def _scalar_error(field: Field, value: object, limits: Limits) -> str | None:
    kind, name = field.kind, field.name
    if kind == "key":
        return _string_error(name, value, field.max_len or limits.key_chars)
    if kind == "id":
        if is_number(value):
            return None if math.isfinite(value) else f"Invalid {name}: must be a finite number"
        return _string_error(name, value, field.max_len or limits.key_chars)
    if kind == "text":
        if type(value) is bool or (is_number(value) and math.isfinite(value)):
            return None
        return _string_error(name, value, field.max_len or limits.text_chars)
    if kind == "bool":
        return None if type(value) is bool else f"Invalid {name}: must be a boolean"
    if kind == "flag":
        if type(value) is bool or isinstance(value, Mapping) or is_number(value):
            return None if not too_deep(value, 2) else f"Invalid {name}: nested too deeply"
        return f"Invalid {name}: must be a boolean"
    if kind == "queue":
        if not isinstance(value, str):
            return "Queue name is required"
        if len(value) > _MAX_QUEUE_CHARS:
            return f"Queue name too long (max {_MAX_QUEUE_CHARS} characters)"
    return None


def overflow_error(field: Field, value: object, limits: Limits = Limits()) -> str | None:
    """For a `worded` field: only what would overflow later arithmetic or a buffer is refused
    here (a finite number beyond its kind's range, a string, list or map over its length, a
    value nested too deeply); anything else is left to the handler's own words."""
    kind = field.kind
    if kind in NUMERIC_KINDS:
        if not is_number(value) or not math.isfinite(value):
            return None
        lo, hi = _KIND_RANGE[kind]
        lo = min(lo, -MAX_SAFE_INTEGER)  # a negative count or delay keeps bunqueue's words
        if value > hi:
            return f"Invalid {field.name}: must be at most {int(hi)}"
        if value < lo:
            return f"Invalid {field.name}: must be at least {int(lo)}"
        return None
    if isinstance(value, str):  # the handler words its own, tighter, length bound
        cap = limits.text_chars
        return (
            None if len(value) <= cap else f"Invalid {field.name}: must be at most {cap} characters"
        )
    if isinstance(value, list | tuple | Mapping):
        cap = limits.map_keys if isinstance(value, Mapping) else limits.list_items
        if kind == "list" or kind == "map":
            cap = field.max_len or cap
        if len(value) > max(cap, limits.list_items if kind == "any" else 0):
            return f"Invalid {field.name}: too many entries"
        if too_deep(value):
            return f"Invalid {field.name}: nested too deeply"
    return None


def field_error(field: Field, value: object, limits: Limits = Limits()) -> str | None:
    """What is wrong with `value` for `field` (None is absent and passes), or None."""
    if value is None:
        return None
    if field.worded:
        return overflow_error(field, value, limits)
    kind = field.kind
    if kind in NUMERIC_KINDS:
        return _number_error(field, value)
    if kind == "list":
        return _list_error(field, value, limits)
    if kind == "map":
        if not isinstance(value, Mapping):
            return f"Invalid {field.name}: must be an object"
        cap = field.max_len or limits.map_keys
        if len(value) > cap:
            return f"Invalid {field.name}: must have at most {cap} keys"
        return f"Invalid {field.name}: nested too deeply" if too_deep(value) else None
    if kind == "any":
        return f"Invalid {field.name}: nested too deeply" if too_deep(value) else None
    return _scalar_error(field, value, limits)
