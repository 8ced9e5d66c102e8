"""Internal messages between the processes: one msgpack map per ZeroMQ frame (docs/runtime.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

__all__ = ["pack", "unpack"]


def pack(msg: Mapping[str, Any]) -> bytes:
    """Encode one internal message. Raises `TypeError` for a value msgpack cannot encode."""
    data: bytes = msgpack.packb(msg, use_bin_type=True)
    return data


def unpack(data: bytes) -> dict[str, Any]:
    """Decode one internal message.

    Raises `ValueError` if `data` is not a msgpack map. Job payloads may carry non-string map
    keys deep inside (the client decoder accepts bytes keys), so keys are not restricted here.
    """
    msg = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if not isinstance(msg, dict):
        raise ValueError(f"internal message is a {type(msg).__name__}, not a map")
    return msg
