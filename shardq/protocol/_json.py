"""JSON bodies read within the schema's bounds: sans-IO.

Python's `json.loads` accepts NaN and Infinity (which no JSON client can read back), integers
of any size (which msgpack cannot pack past 64 bits) and nesting until the interpreter's
recursion limit (a `RecursionError`, not a `ValueError`). `loads` refuses all three with a
clear `ValueError`, so an HTTP body or a WebSocket message gets a 400, never a 500.
"""

from __future__ import annotations

import json
from typing import Any, Final

from ._fields import MAX_NESTING, too_deep

__all__ = ["loads"]

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1  # msgpack's range: int64 and uint64


def _constant(name: str) -> Any:
    raise ValueError(f"Invalid JSON: {name} is not a number JSON allows")


def _integer(text: str) -> int:
    if len(text) > 21:  # longer than any 64-bit integer: refused before it is converted
        raise ValueError("Invalid JSON: integer out of range")
    value = int(text)
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError("Invalid JSON: integer out of range")
    return value


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("Invalid JSON: number out of range")
    return value


def loads(text: str | bytes) -> Any:
    """The value of a JSON document, or ValueError (`Invalid JSON: <why>`)."""
    try:
        value = json.loads(text, parse_constant=_constant, parse_int=_integer, parse_float=_float)
    except json.JSONDecodeError:
        raise ValueError("Invalid JSON") from None  # the parser's position says little more
    except RecursionError:
        raise ValueError("Invalid JSON: nested too deeply") from None
    except UnicodeDecodeError:
        raise ValueError("Invalid JSON: not UTF-8") from None
    if too_deep(value, MAX_NESTING):
        raise ValueError("Invalid JSON: nested too deeply")
    return value
