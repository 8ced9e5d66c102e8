"""The `reqId` of a frame body that does not decode, so its refusal reaches its request.

A body can be well-formed msgpack and still not decode into a command: a string that is not
UTF-8, or nesting deeper than the decoder allows. A pipelining client then needs the refusal to
carry the request's id. This walks the top-level map with an explicit counter instead of
recursion (whatever the nesting), skips every value but `reqId`'s, and decodes only that one.
"""

from __future__ import annotations

import struct
from typing import Final

import msgpack  # type: ignore[import-untyped]

__all__ = ["salvage_req_id"]

# Fixed-size types: first byte -> bytes that follow.
_FIXED: Final = {
    0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
    0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,
}  # fmt: skip
# Sized types: first byte -> (bytes of the length, extra bytes after it: an ext's type).
_SIZED: Final = {
    0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0),
    0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
}  # fmt: skip
_COUNTS: Final = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
_LEN: Final = {1: ">B", 2: ">H", 4: ">I"}


def _length(data: bytes, at: int, size: int) -> int:
    return int(struct.unpack_from(_LEN[size], data, at)[0])


def _head(data: bytes, at: int) -> tuple[int, int]:
    """(where the value's payload ends if it holds no children, children it holds)."""
    b = data[at]
    if b <= 0x7F or b >= 0xE0:
        return at + 1, 0
    if 0x80 <= b <= 0x8F:
        return at + 1, 2 * (b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return at + 1, b & 0x0F
    if 0xA0 <= b <= 0xBF:
        return at + 1 + (b & 0x1F), 0
    if b in _FIXED:
        return at + 1 + _FIXED[b], 0
    if b in _SIZED:
        size, extra = _SIZED[b]
        return at + 1 + size + extra + _length(data, at + 1, size), 0
    if b in _COUNTS:
        size, per = _COUNTS[b]
        return at + 1 + size, per * _length(data, at + 1, size)
    raise ValueError(f"not msgpack: byte {b:#x}")


def _skip(data: bytes, at: int) -> int:
    """Where the value starting at `at` ends, without recursion."""
    pending = 1
    while pending:
        at, children = _head(data, at)
        pending += children - 1
        if at > len(data):
            raise ValueError("truncated")
    return at


def salvage_req_id(body: bytes | memoryview) -> str | int | None:
    """The body's top-level `reqId` if it is a plain string or integer, else None."""
    data = bytes(body)
    try:
        at, children = _head(data, 0)
        if not 0x80 <= data[0] <= 0x8F and data[0] not in (0xDE, 0xDF):
            return None
        for _ in range(children // 2):
            key_end = _skip(data, at)
            value_end = _skip(data, key_end)
            if data[at:key_end] == b"\xa5reqId":
                req = msgpack.unpackb(data[key_end:value_end], raw=False)
                return _plain(req)
            at = value_end
    except (ValueError, IndexError, struct.error):
        return None
    return None


def _plain(req: object) -> str | int | None:
    if type(req) is int and -(2**63) <= req < 2**64:
        return req
    if type(req) is str and len(req) <= 256:
        return req
    return None
