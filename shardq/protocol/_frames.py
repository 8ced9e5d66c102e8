"""Frames of the bunqueue wire protocol: a u32 big-endian body length, then a msgpack body.

The same layout runs in both directions. This module turns bytes into command maps and maps into
bytes, and nothing else: it owns no socket, reads no clock and knows no event loop, so the TCP
front end and both clients are thin adapters around it.

What a decoded command may contain: `dict` (top level: `str` keys only; nested: `str` or
`bytes` keys), `list`, `str`, `bytes`, `int`, `float`, `bool` and `None`. Extension types are
mapped onto that set or refused, see `_ext_hook` and `_unpack`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeAlias

import msgpack  # type: ignore[import-untyped]

from shardq.errors import ProtocolError
from shardq.protocol._errors import INVALID_COMMAND, INVALID_COMMAND_FORMAT, frame_too_large

__all__ = [
    "MAX_FRAME_SIZE",
    "DecodedFrame",
    "FrameDecoder",
    "check_command",
    "encode",
    "encode_many",
    "error_reply",
    "req_id",
]

MAX_FRAME_SIZE: Final = 64 * 1024 * 1024
"""bunqueue's cap on a frame body (`frameParser.ts`), checked against the declared length."""

_HEADER: Final = struct.Struct(">I")

# msgpackr, the encoder of bunqueue's own JS clients, writes JS `undefined` as fixext1 type 0,
# and bunqueue's protocol doc tells peers to read that as nil.
_JS_UNDEFINED_EXT: Final = 0

DecodedFrame: TypeAlias = dict[str, Any] | ProtocolError
"""One item from `FrameDecoder.feed`: a command map, or the error to answer it with."""


class _RefusedExt(ValueError):
    """An extension type other than JS `undefined` (msgpackr's Set, Error, RegExp, ...)."""


def _ext_hook(code: int, data: bytes) -> None:
    if code == _JS_UNDEFINED_EXT:
        return None
    raise _RefusedExt(f"msgpack ext type {code} ({len(data)} bytes) is not accepted")


def _unpack(body: memoryview) -> Any:
    # strict_map_key refuses int, float, nil and array keys anywhere in the tree. The standard
    # timestamp ext (-1, what msgpackr writes for a JS Date) never reaches ext_hook; timestamp=1
    # turns it into float seconds since the epoch, so a decoded command holds only plain types.
    # unpackb bounds every container by the body length, which the frame cap already bounds.
    return msgpack.unpackb(
        body,
        raw=False,
        strict_map_key=True,
        ext_hook=_ext_hook,
        timestamp=1,
    )


def _decode_body(body: memoryview) -> DecodedFrame:
    if not body:
        return ProtocolError(INVALID_COMMAND_FORMAT)
    try:
        obj = _unpack(body)
    except ValueError as e:
        # msgpack reports every malformed body (bad format, truncation, trailing bytes, bad
        # UTF-8, nesting too deep, refused keys or ext types) as a ValueError subclass.
        error = ProtocolError(INVALID_COMMAND_FORMAT)
        error.__cause__ = e
        return error
    if not isinstance(obj, dict) or not all(isinstance(key, str) for key in obj):
        return ProtocolError(INVALID_COMMAND_FORMAT)
    return obj


class FrameDecoder:
    """Reassembles frames from bytes that arrive in arbitrary pieces.

    Feed it whatever the socket produced; it returns the frames those bytes completed, in order.
    One peer connection owns one decoder.
    """

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        """Create a decoder that refuses bodies longer than `max_frame_size` bytes.

        Raises `ValueError` if `max_frame_size` is negative.
        """
        if max_frame_size < 0:
            raise ValueError(f"max_frame_size must be >= 0, got {max_frame_size}")
        # Not final: the front end raises it once a connection has authenticated.
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        # Consumed frames are cut off the front once per feed, not once per frame, so that a
        # read holding many small frames costs one copy instead of one per frame.
        self._pos = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once an oversize frame was seen; the decoder then ignores all input."""
        return self._closed

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that is not complete yet (what a stall timer watches)."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> list[DecodedFrame]:
        """Add `data` and return every frame it completed, oldest first.

        Each item is a command map, or a `ProtocolError` to send back to the peer: a body that
        is not a msgpack map with string keys gives a non-fatal "Invalid command format" and
        decoding continues with the next frame. A declared length over `max_frame_size` gives a
        fatal "Frame too large: ..." error as the last item; the caller should close the
        connection, and from then on the decoder drops its buffer and ignores all input.
        Frames completed before the oversize header are still returned ahead of it.

        Never raises for any content of `data`. Bytes of an incomplete frame stay buffered
        until more data arrives; at EOF they are simply discarded with the decoder.
        """
        if self._closed:
            return []
        self._buf += data
        frames: list[DecodedFrame] = []
        while (frame := self._next_frame()) is not None:
            frames.append(frame)
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        return frames

    def _next_frame(self) -> DecodedFrame | None:
        start = self._pos + _HEADER.size
        if len(self._buf) < start:
            return None
        (size,) = _HEADER.unpack_from(self._buf, self._pos)
        if size > self.max_frame_size:
            # Refuse on the header alone: waiting for the body would let a peer make us
            # buffer up to 4 GiB before we answer.
            self._close()
            return ProtocolError(frame_too_large(size, self.max_frame_size), fatal=True)
        end = start + size
        if len(self._buf) < end:
            return None
        self._pos = end
        # A view avoids copying the body; both views are released before the buffer is
        # resized, which a live export would forbid.
        with memoryview(self._buf) as whole, whole[start:end] as body:
            return _decode_body(body)

    def _close(self) -> None:
        self._closed = True
        self._buf = bytearray()
        self._pos = 0


def encode(msg: Mapping[str, Any]) -> bytes:
    """Return `msg` as one frame: a u32 big-endian body length, then the msgpack body.

    `bytes` values travel as msgpack bin and `str` as str. No size cap is applied here; a body
    over `MAX_FRAME_SIZE` will be refused by a bunqueue peer.

    Raises `TypeError` if `msg` holds a value msgpack cannot encode, `OverflowError` for an
    integer outside the 64-bit ranges, and `ValueError` if the body is longer than a u32 can
    declare.
    """
    body: bytes = msgpack.packb(msg if isinstance(msg, dict) else dict(msg), use_bin_type=True)
    if len(body) > 0xFFFF_FFFF:
        raise ValueError(f"a {len(body)}-byte body does not fit a u32 length prefix")
    return _HEADER.pack(len(body)) + body


def encode_many(msgs: Iterable[Mapping[str, Any]]) -> bytes:
    """Return the frames of `msgs`, in order, joined into one bytes object for one write.

    Raises what `encode` raises.
    """
    return b"".join(encode(msg) for msg in msgs)


def check_command(msg: Mapping[str, Any]) -> str:
    """Return the command name `msg["cmd"]`.

    Raises `ProtocolError("Invalid command")` (not fatal) when `cmd` is missing, not a `str`,
    or empty; bunqueue refuses a falsy `cmd` the same way.
    """
    cmd = msg.get("cmd")
    if not isinstance(cmd, str) or not cmd:
        raise ProtocolError(INVALID_COMMAND)
    return cmd


def req_id(msg: Mapping[str, Any]) -> str | None:
    """Return `msg["reqId"]` if it is a `str`, else None.

    bunqueue echoes `reqId` on transport-level errors only when it is a string.
    """
    value = msg.get("reqId")
    return value if isinstance(value, str) else None


def error_reply(message: str, req_id: str | None = None) -> dict[str, Any]:
    """Return the error envelope ``{"ok": False, "error": message}``, with `reqId` if given."""
    reply: dict[str, Any] = {"ok": False, "error": message}
    if req_id is not None:
        reply["reqId"] = req_id
    return reply
