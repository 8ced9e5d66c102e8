"""A PUSHB passed to its shard as the client's own bytes (issue 24, `pushb_pass_through`).

The front end needs little of a PUSHB: its `reqId`, its queue (for the shard) and the certainty
that no entry names a flow (`parentId`, `childrenIds`: the front end checks those parents
first). Decoding every pushed job only to pack it again for the shard cost the front end about
4,600 instructions a job. `peek_pushb` reads just those fields off the body (its other values
are skipped in C, not built) and the front end sends the body on as it is; the shard decodes
it once, with the same decoder (`decode_raw_pushb`).

What the general path does must not change, reply for reply. The front end looks closer only
at a body that opens `{"cmd": "PUSHB", ...` (a fixmap, `cmd` first as clients write it; any
other order takes the general path), and passes it through only when it is a map whose `cmd`
is the str "PUSHB" and whose `queue` is a str, neither
named twice (the decoder keeps the last), and when neither `parentId` nor `childrenIds` occurs
anywhere in its bytes (a key in a msgpack map is its UTF-8 bytes, so such a body names no flow).
Once `cmd` and `queue` are read, the rest of the map is not even skipped where the bytes of
`cmd`, `queue` and `reqId` occur no more: no such key can follow.

Clients put `reqId` last, after the jobs. Skipping the jobs to reach it cost the front end
about 790 instructions a job, so the front end reads it off the body's end instead
(`tail_req`): when the last `reqId` bytes in the body follow a fixstr header and are followed
by a str or int that ends the body, and no `cmd` or `queue` bytes follow the jobs, that is the
`reqId` if the top-level map has one at all. Whether it is, is only known after a full decode
(the bytes could close the last job's data, or lie inside a string), so the shard, in its one
decode, refuses a body whose `tail_req` is not its top-level `reqId`, type and value alike
(the general path then answers it), whether or not the front end used the guess.

Everything else the general path would refuse, the shard finds in its one decode: a string
that is not UTF-8, a refused extension type, a non-str key, bytes after the map, and nesting
too deep for the general path's `req` batch (which carries the decoded map three levels down,
`{t, items: [[conn, rid, command]]}`: the shard decodes the body behind three one-element
array headers, so msgpack's depth limit falls where it fell). It then answers `raw_refused`,
having changed nothing, and the front end sends the body down the general path, which answers
it as it always did.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import msgpack  # type: ignore[import-untyped]

from shardq.protocol._errors import INVALID_COMMAND_FORMAT
from shardq.protocol._frames import _IS_STR, DecodedFrame, _ext_hook, _unpack, decode_body

__all__ = [
    "RAW_REFUSED",
    "Incoming",
    "RawPush",
    "decode_or_peek",
    "decode_raw_pushb",
    "peek_pushb",
    "raw_refused",
    "tail_req",
]

# Three one-element arrays: the depth of a command inside the front end's `req` batch.
_DEPTH_OF_BATCH: Final = b"\x91\x91\x91"
# What a PUSHB body opens with after its fixmap header: `cmd` as a fixstr, "PUSHB" as one.
_HEAD: Final = b"\xa3cmd\xa5PUSHB"
_HEAD_END: Final = 1 + len(_HEAD)
_PUSHB_AT: Final = 5  # the fixstr header of the command's name (PUSH: 0xa4; PULLB: 0xa5)
_FIXSTR5: Final = 0xA5
_FLOW_KEYS: Final = (b"parentId", b"childrenIds")
_PEEKED: Final = frozenset({"cmd", "queue", "reqId"})
_REQ: Final = b"reqId"
_FIXSTR_REQ: Final = 0xA5  # the fixstr header byte before a `reqId` key
# The header sizes of a str8, str16 and str32 (its length field follows the first byte).
_SIZED: Final = {0xD9: 2, 0xDA: 3, 0xDB: 5}
_INTS: Final = {0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9}
_MISSING: Final = object()
# How far from the end `tail_req` looks for a `reqId` key: its bytes and a str of up to 256
# bytes (a longer reqId, rare, makes the front end skip the jobs as before).
_TAIL_MAX: Final = len(_REQ) + 3 + 256

RAW_REFUSED: Final = "rawRefused"
"""The key of a shard's reply to a passed-through body it could not take (`raw_refused`);
never sent to a client (the front end answers through the general path instead)."""


class RawPush:
    """A PUSHB body bound for its shard undecoded: the bytes, its queue and its `reqId`."""

    __slots__ = ("body", "has_req", "queue", "req")

    def __init__(self, body: bytes, queue: str, req: Any, has_req: bool) -> None:
        self.body = body
        self.queue = queue
        self.req = req  # the client's `reqId`, verbatim (any type), when `has_req`
        self.has_req = has_req


def _fields(body: bytes) -> dict[str, Any] | None:
    """`cmd`, `queue` and `reqId` of the top-level map (None if one appears twice)."""
    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        ext_hook=_ext_hook,
        timestamp=1,
        max_buffer_size=len(body),
    )
    unpacker.feed(body)
    found: dict[str, Any] = {}
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if type(key) is str and key in _PEEKED:
            if key in found:
                return None  # the decoder keeps the last: leave that to the general path
            found[key] = unpacker.unpack()
        elif "cmd" in found and "queue" in found and _settled(body, unpacker.tell(), found):
            break  # no key read here can follow, or the `reqId` was read off the end
        else:
            unpacker.skip()
    return found


def _settled(body: bytes, at: int, found: dict[str, Any]) -> bool:
    """Whether the rest of the map from `at` need not be read: no `cmd` or `queue` key can
    start there (their bytes do not occur there, in any string encoding), and either no
    `reqId` key can, or none was read yet and one ends the body (`tail_req`: then `found`
    takes it, and the shard confirms it in `decode_raw_pushb`)."""
    if body.find(b"cmd", at) >= 0 or body.find(b"queue", at) >= 0:
        return False
    if "reqId" not in found:
        tail = tail_req(body)
        if tail is not None and tail[0] >= at:
            found["reqId"] = tail[1]
            return True
    return body.find(_REQ, at) < 0


def _value_size(body: bytes, at: int) -> int:
    """The size of the str or int whose header is at `at` (0 if it is neither, or cut)."""
    head = body[at]
    if head < 0x80 or head >= 0xE0:
        return 1
    if 0xA0 <= head < 0xC0:
        return 1 + head - 0xA0
    if head in _INTS:
        return _INTS[head]
    if head in _SIZED:
        start = _SIZED[head]
        return start + int.from_bytes(body[at + 1 : at + start], "big")
    return 0


def tail_req(body: bytes) -> tuple[int, str | int] | None:
    """Where the last `reqId` bytes of `body` start and the str or int after them, when they
    follow a fixstr header and the value ends the body, else None. Only a guess at the
    top-level `reqId` (the bytes may sit in a job's data, or in a string): the shard checks it
    against its decode (`decode_raw_pushb`). Reads only the body's end. Never raises."""
    at = body.rfind(_REQ, max(0, len(body) - _TAIL_MAX))
    value_at = at + len(_REQ)
    if at < 1 or body[at - 1] != _FIXSTR_REQ or value_at >= len(body):
        return None
    if value_at + _value_size(body, value_at) != len(body):
        return None
    head = body[value_at]
    try:
        if 0xA0 <= head < 0xC0:  # a fixstr, as clients send: no unpacker call
            value: Any = body[value_at + 1 :].decode()
        else:
            value = msgpack.unpackb(body[value_at:], raw=False)
    except Exception:
        return None  # a str that is not UTF-8: the general path answers it
    return (at, value) if type(value) in (str, int) else None


def peek_pushb(view: bytes | memoryview) -> RawPush | None:
    """The body as a `RawPush` if it may be passed to its shard undecoded, else None (then it
    takes the general path: `decode_body`). Never raises."""
    body = bytes(view)
    if _FLOW_KEYS[0] in body or _FLOW_KEYS[1] in body:
        return None
    try:
        found = _fields(body)
    except Exception:
        return None
    if found is None or found.get("cmd") != "PUSHB":
        return None
    queue = found.get("queue")
    if type(queue) is not str:
        return None
    return RawPush(body, queue, found.get("reqId"), "reqId" in found)


def decode_raw_pushb(body: bytes) -> dict[str, Any] | None:
    """The shard's decode of a passed-through body: the command map as the general path would
    have sent it (the client's map without `reqId`), or None when the decoder refuses the body
    or it is not the PUSHB it was peeked as (the front end then takes the general path)."""
    try:
        # Three levels down, as the general path's `req` batch carries the decoded map: a body
        # nested too deep for that is refused here (the general path answers it).
        cmd = _unpack(_DEPTH_OF_BATCH + body)[0][0][0]
    except ValueError:
        return None
    if (
        type(cmd) is not dict
        or not all(map(_IS_STR, cmd))
        or cmd.get("cmd") != "PUSHB"
        or type(cmd.get("queue")) is not str
    ):
        return None
    req = cmd.pop("reqId", _MISSING)
    tail = tail_req(body)
    if tail is not None and (type(req) is not type(tail[1]) or req != tail[1]):
        return None  # the front end may have answered with a `reqId` the map does not hold
    return cmd


def raw_refused() -> dict[str, Any]:
    """The shard's reply to a passed-through body it did not take (`decode_raw_pushb`)."""
    return {"ok": False, "error": INVALID_COMMAND_FORMAT, RAW_REFUSED: True}


Incoming: TypeAlias = DecodedFrame | RawPush
"""A client frame as the front end's TCP and ZeroMQ ports hand it on."""


def decode_or_peek(view: memoryview | bytes) -> Incoming:
    """A frame body as a `RawPush` when it may pass undecoded (`peek_pushb`), else decoded.
    Only a body that opens `{"cmd": "PUSHB", ...` (a map of under 16 keys, `cmd` first, as
    clients write it) is looked at closer: every other command pays two byte tests."""
    if len(view) > _HEAD_END and view[_PUSHB_AT] == _FIXSTR5 and view[1:_HEAD_END] == _HEAD:
        raw = peek_pushb(view)
        if raw is not None:
            return raw
    return decode_body(view)
