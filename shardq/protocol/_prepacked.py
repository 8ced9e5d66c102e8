"""Replies packed once, where they are made, and passed through the front end as bytes.

A PULLB of 100 jobs is about 30 KB of msgpack. Decoding it in the front end only to encode it
again for the client cost more than half of the front end's time in a drain. So a shard packs
such a reply in its final form (for a TCP client with bunqueue's JavaScript numbers, see
`_jsnum`) and sends it inside a small map:

    {"ok": true, "_ids": [job ids], "_wire": <the packed reply map, without reqId>}

The front end reads the ids (its job-to-shard cache and counters need them) and splices the
request's `reqId` into the packed map, without decoding the jobs. The bytes a client gets are
those it would get had the front end decoded and encoded the reply itself.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]

from shardq.protocol._frames import frame, pack_body
from shardq.protocol._jsnum import js_numbers

__all__ = [
    "IDS_KEY",
    "JS_NUMBERS",
    "PLAIN_NUMBERS",
    "WIRE_KEY",
    "WIRE_MODE_KEY",
    "js_safe",
    "prepacked_body",
    "prepacked_frame",
]

WIRE_KEY: Final = "_wire"
"""The packed reply map, in a pass-through reply."""
IDS_KEY: Final = "_ids"
"""The ids of the jobs in a pass-through reply."""
WIRE_MODE_KEY: Final = "_wire_mode"
"""The shard's mark on a reply it will pack for passing through (how to pack its numbers, from
the request's envelope); `shard._wire` drops it when it packs the reply."""
PLAIN_NUMBERS: Final = 1  # msgpack's own integers (ZeroMQ clients)
JS_NUMBERS: Final = 2  # integers beyond 32 bits as float64 (TCP: bunqueue's clients)

# Ints, not one-byte strings: `0xCF in body` is a plain byte search, where `b"\xcf" in body`
# first tries the needle as a number, and that costs about ten times the search.
_UINT64: Final = 0xCF
_INT64: Final = 0xD3
# The lengths in msgpack's map16 and map32 headers (`_map_size`), not frame headers.
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_REQ_ID: Final = msgpack.packb("reqId", use_bin_type=True)
_map_header = msgpack.Packer(use_bin_type=True).pack_map_header


def js_safe(body: bytes) -> bytes:
    """`body` (a packed value) with no 64-bit integer left: if a marker byte of one occurs
    (it may also be a byte of a float or a string), decode, float the large ints, and pack."""
    if _UINT64 not in body and _INT64 not in body:
        return body
    value = msgpack.unpackb(body, raw=False, strict_map_key=False)
    packed: bytes = msgpack.packb(js_numbers(value), use_bin_type=True)
    return packed


def prepacked_body(reply: Mapping[str, Any]) -> bytes:
    """The packed reply map of a pass-through `reply`, with its `reqId` (set by the
    dispatcher, if the request had one) spliced in first."""
    body: bytes = reply[WIRE_KEY]
    if "reqId" not in reply:
        return body
    count, skip = _map_size(body)
    req = pack_body(reply["reqId"])
    return b"".join((_map_header(count + 1), _REQ_ID, req, body[skip:]))


def prepacked_frame(reply: Mapping[str, Any]) -> bytes:
    """A pass-through `reply` as one TCP frame."""
    return frame(prepacked_body(reply))


def _map_size(body: bytes) -> tuple[int, int]:
    """(entries, header bytes) of the msgpack map `body` starts with."""
    first = body[0]
    if 0x80 <= first <= 0x8F:
        return first & 0x0F, 1
    if first == 0xDE:
        return _U16.unpack_from(body, 1)[0], 3
    if first == 0xDF:
        return _U32.unpack_from(body, 1)[0], 5
    raise ValueError(f"a pass-through reply must be a packed map, not 0x{first:02x}")
