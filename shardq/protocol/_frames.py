"""Frames of the bunqueue wire protocol: a u32 big-endian body length, then a msgpack body.

The same layout runs in both directions, and on the internal front end <-> shard and shard <->
writer links. `FrameCutter` is the one place where such a stream is cut into frames: the TCP
front end (`FrameDecoder`), the clients (`shardq.client._core`) and the links
(`shardq.runtime.links._stream`) all cut with it. Beside it, `frame` is the one place a frame is
made, and `send_frame` the one way one is handed to a socket (the links' writers and the
encoders here all go through them). This module turns bytes into command maps and
maps into bytes, and nothing else: it owns no socket, reads no clock and knows no event loop.

What a decoded command may contain: `dict` (top level: `str` keys only; nested: `str` or
`bytes` keys), `list`, `str`, `bytes`, `int`, `float`, `bool` and `None`. Extension types are
mapped onto that set or refused, see `_ext_hook` and `_unpack`.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeAlias, TypeVar, cast

import msgpack  # type: ignore[import-untyped]

from shardq.errors import ProtocolError
from shardq.protocol._errors import INVALID_COMMAND, INVALID_COMMAND_FORMAT, frame_too_large
from shardq.protocol._salvage import salvage_req_id

__all__ = [
    "FRAME_HEADER",
    "MAX_FRAME_SIZE",
    "DecodedFrame",
    "FrameCutter",
    "FrameDecoder",
    "check_command",
    "decode_body",
    "encode",
    "encode_many",
    "error_reply",
    "frame",
    "pack_body",
    "req_id",
    "send_frame",
]

MAX_FRAME_SIZE: Final = 64 * 1024 * 1024
"""bunqueue's cap on a frame body (`frameParser.ts`), checked against the declared length."""

FRAME_HEADER: Final = struct.Struct(">I")
"""The u32 big-endian length in front of every frame body."""
_HEADER: Final = FRAME_HEADER
_IS_STR: Final = str.__instancecheck__
T = TypeVar("T")

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


def _unpack(body: bytes | memoryview) -> Any:
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


def decode_body(body: bytes | memoryview) -> DecodedFrame:
    """One frame body as a command map, or the (non-fatal) error to answer it with."""
    if not body:
        return ProtocolError(INVALID_COMMAND_FORMAT)
    try:
        obj = _unpack(body)
    except ValueError as e:
        # msgpack reports every malformed body (bad format, truncation, trailing bytes, bad
        # UTF-8, nesting too deep, refused keys or ext types) as a ValueError subclass.
        error = ProtocolError(INVALID_COMMAND_FORMAT)
        error.__cause__ = e
        error.req_id = salvage_req_id(body)
        return error
    # Keys are str or bytes (strict_map_key); checked without a Python frame per key.
    if not isinstance(obj, dict) or not all(map(_IS_STR, obj)):
        return ProtocolError(INVALID_COMMAND_FORMAT)
    return obj


class FrameCutter:
    """Sans-IO: bytes in (any chunking), whole frame bodies out, in order.

    `cut` hands each body to a `take` function as a memoryview that is valid only during the
    call (decode it, or copy it with `bytes`), so a body is never copied just to be decoded.
    While nothing is buffered (the usual case: a read ends on a frame boundary) frames are cut
    straight out of the chunk; only a partial tail is copied, and kept for the next chunk.

    A header over `max_frame_size` is refused on the header alone (waiting for the body would
    let a peer make us buffer up to 4 GiB): `oversize` then holds the declared size, the buffer
    is dropped, and every later chunk is ignored.
    """

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        """Raises `ValueError` if `max_frame_size` is negative."""
        if max_frame_size < 0:
            raise ValueError(f"max_frame_size must be >= 0, got {max_frame_size}")
        # Not final: the front end raises it once a connection has authenticated.
        self.max_frame_size = max_frame_size
        self.oversize: int | None = None
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that is not complete yet (what a stall timer watches)."""
        return len(self._buf)

    def pending(self) -> bytes:
        """A copy of the bytes held for the incomplete frame."""
        return bytes(self._buf)

    def cut(
        self, chunk: bytes | bytearray | memoryview, take: Callable[[memoryview], T]
    ) -> list[T]:
        """Add `chunk`; return `take(body)` for every frame it completed, oldest first.

        `chunk` is not kept: it may be a view of a buffer the caller reuses. Frames completed
        before an oversize header are still returned.
        """
        if self.oversize is not None:
            return []
        buf = self._buf
        data: bytes | bytearray | memoryview = chunk
        if buf:
            buf += chunk
            data = buf
        out: list[T] = []
        start = 0
        end = len(data)
        limit = self.max_frame_size
        with memoryview(data) as view:
            while end - start >= 4:
                (size,) = _HEADER.unpack_from(view, start)
                if size > limit:
                    self.oversize = size
                    self._buf = bytearray()
                    return out
                stop = start + 4 + size
                if stop > end:
                    break
                # Released before the buffer is resized, which a live export would forbid.
                with view[start + 4 : stop] as body:
                    out.append(take(body))
                start = stop
            if data is not buf and start < end:
                buf += view[start:]
        if data is buf and start:
            del buf[:start]
        return out


class FrameDecoder:
    """Reassembles command frames from bytes that arrive in arbitrary pieces.

    Feed it whatever the socket produced; it returns the frames those bytes completed, in order.
    One peer connection owns one decoder.
    """

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        """Create a decoder that refuses bodies longer than `max_frame_size` bytes.

        Raises `ValueError` if `max_frame_size` is negative.
        """
        self._cutter = FrameCutter(max_frame_size)

    @property
    def max_frame_size(self) -> int:
        return self._cutter.max_frame_size

    @max_frame_size.setter
    def max_frame_size(self, value: int) -> None:
        # The front end raises it once a connection has authenticated.
        self._cutter.max_frame_size = value

    @property
    def closed(self) -> bool:
        """True once an oversize frame was seen; the decoder then ignores all input."""
        return self._cutter.oversize is not None

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that is not complete yet (what a stall timer watches)."""
        return self._cutter.buffered

    def pending(self) -> bytes:
        """A copy of the bytes held for the frame that is not complete yet (what goes with a
        connection handed to a shard, `tcp_handoff`)."""
        return self._cutter.pending()

    def feed(self, data: bytes | bytearray | memoryview) -> list[DecodedFrame]:
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
        return self.feed_with(data, decode_body)

    def feed_with(
        self, data: bytes | bytearray | memoryview, take: Callable[[memoryview], T]
    ) -> list[T | ProtocolError]:
        """`feed`, each body made an item by `take` (`decode_body`, or the front end's
        `decode_or_peek`, which passes a PUSHB on undecoded); the fatal error as in `feed`."""
        cutter = self._cutter
        if cutter.oversize is not None:
            return []
        # The same list (invariance alone stops mypy from seeing it widened).
        frames = cast("list[T | ProtocolError]", cutter.cut(data, take))
        if cutter.oversize is not None:
            limit = cutter.max_frame_size
            frames.append(ProtocolError(frame_too_large(cutter.oversize, limit), fatal=True))
        return frames


class _Packer(threading.local):
    """One msgpack packer per thread: `msgpack.packb` builds a packer (and its buffer) per
    call, which costs as much again as packing a small reply."""

    def __init__(self) -> None:
        self.pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack


_PACKER: Final = _Packer()


def pack_body(body: Any) -> bytes:
    """`msgpack.packb(body, use_bin_type=True)`, with this thread's packer."""
    return _PACKER.pack(body)


def frame(body: bytes) -> bytes:
    """`body` with its length header in front: one frame, ready to write."""
    return _HEADER.pack(len(body)) + body


def send_frame(sendmsg: Callable[[tuple[bytes, bytes]], int], body: bytes) -> bytes:
    """Hand one frame to a stream socket's `sendmsg`; return the part it did not take (empty
    when it took it all), which the caller must write next for the stream to stay whole.

    Header and body go in one call without being joined first (a link's batch is tens of
    kilobytes); only a partial write makes a copy. Raises what `sendmsg` raises: a
    `BlockingIOError` means nothing was taken.
    """
    sent = sendmsg((_HEADER.pack(len(body)), body))
    if sent == len(body) + _HEADER.size:
        return b""
    return frame(body)[sent:]


def encode(msg: Mapping[str, Any]) -> bytes:
    """Return `msg` as one frame: a u32 big-endian body length, then the msgpack body.

    `bytes` values travel as msgpack bin and `str` as str. No size cap is applied here; a body
    over `MAX_FRAME_SIZE` will be refused by a bunqueue peer.

    Raises `TypeError` if `msg` holds a value msgpack cannot encode, `OverflowError` for an
    integer outside the 64-bit ranges, and `ValueError` if the body is longer than a u32 can
    declare.
    """
    body = _PACKER.pack(msg if isinstance(msg, dict) else dict(msg))
    if len(body) > 0xFFFF_FFFF:
        raise ValueError(f"a {len(body)}-byte body does not fit a u32 length prefix")
    return frame(body)


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


def error_reply(message: str, req_id: str | int | None = None) -> dict[str, Any]:
    """Return the error envelope ``{"ok": False, "error": message}``, with `reqId` if given."""
    reply: dict[str, Any] = {"ok": False, "error": message}
    if req_id is not None:
        reply["reqId"] = req_id
    return reply
