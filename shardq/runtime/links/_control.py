"""Internal messages between the processes: one msgpack map per ZeroMQ frame (docs/runtime.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

__all__ = ["exact_packer", "pack", "unpack"]


def pack(msg: Mapping[str, Any]) -> bytes:
    """Encode one internal message. Raises `TypeError` for a value msgpack cannot encode."""
    data: bytes = msgpack.packb(msg, use_bin_type=True)
    return data


def exact_packer() -> Callable[[Any], bytes]:
    """A `pack` that gives the same bytes, and raises the same `TypeError`, as `pack`; faster
    for maps and lists, slower for tuples. Not thread-safe: one per thread.

    By default msgpack tests each value against its types with subclass checks, several per
    value before it reaches a map or a list. With `strict_types` it only compares exact types:
    a PULLB reply of 100 jobs (maps and lists only) packs in about 115 µs instead of 150. A
    value of another type goes through `_lenient`, a Python call, which makes it worse for
    tuples (mutation batches are mostly tuples: use `pack` there).
    """
    packer = msgpack.Packer(use_bin_type=True, strict_types=True, default=_lenient)
    packed: Callable[[Any], bytes] = packer.pack
    return packed


def _lenient(value: object) -> object:
    """`value` as the exact type that lenient msgpack packs it as; `TypeError` if none."""
    if isinstance(value, msgpack.ExtType):  # a tuple too, but packed as an extension
        return msgpack.ExtType(value.code, value.data)
    if isinstance(value, msgpack.Timestamp):
        return msgpack.Timestamp(value.seconds, value.nanoseconds)
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value.items())
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return bytes(value)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


def unpack(data: bytes | memoryview) -> dict[str, Any]:
    """Decode one internal message.

    Raises `ValueError` if `data` is not a msgpack map. Job payloads may carry non-string map
    keys deep inside (the client decoder accepts bytes keys), so keys are not restricted here.
    """
    msg = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if not isinstance(msg, dict):
        raise ValueError(f"internal message is a {type(msg).__name__}, not a map")
    return msg
