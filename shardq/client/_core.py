"""The client's protocol state, sans-IO: request ids, encoding, reply matching.

Every transport (sync or asyncio, TCP or ZeroMQ) is a thin adapter around one `ClientCore`:

    rids, payloads = core.prepare(commands, waiters)   # bytes to write, one waiter per command
    for waiter, reply in core.feed(data): ...          # TCP: whatever recv() returned
    matched = core.receive(body)                       # ZeroMQ: one message
    core.forget(rids)                                  # a caller gave up (timeout)
    for waiter in core.fail_all(): ...                 # the connection broke
    core.ended                                         # a shard's direct port said goodbye

A waiter is whatever the adapter resolves when the reply comes (a future, a slot index). The
core opens no socket, reads no clock and knows no event loop, like `shardq.protocol`. Replies
come back in any order (the server answers out of order); they are matched by `reqId`, a
decimal string counter, as bunqueue's own clients use.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar

import msgpack  # type: ignore[import-untyped]

from shardq.client._errors import (
    CommandTimeout,
    ConnectionLost,
    SerializationError,
    error_from_reply,
)
from shardq.protocol import MAX_FRAME_SIZE, FrameCutter, encode, frame_too_large
from shardq.protocol._direct import DIRECT_CLOSING

__all__ = ["ClientCore", "Framing", "Waiter", "checked", "fail_waiters", "no_reply"]

W = TypeVar("W")
Reply = dict[str, Any]

_ENCODE_ERRORS: Final = (TypeError, ValueError, OverflowError)


class Waiter(Protocol):
    """What the transports' waiters are: a `concurrent.futures` or an asyncio `Future`."""

    def done(self) -> bool: ...

    def set_exception(self, exception: BaseException) -> None: ...


def fail_waiters(waiters: Iterable[Waiter], message: str, *, sent: bool = True) -> None:
    """Fail the waiters not yet done with `ConnectionLost(message, sent=sent)`."""
    for waiter in waiters:
        if not waiter.done():
            waiter.set_exception(ConnectionLost(message, sent=sent))


def no_reply(name: object, timeout: float) -> CommandTimeout:
    """The error of a command `name` that had no reply within `timeout` seconds."""
    return CommandTimeout(f"no reply to {name!r} within {timeout:g} s")


class Framing(enum.Enum):
    """How commands travel: u32-prefixed frames on a byte stream, or one ZeroMQ message each."""

    STREAM = "stream"
    MESSAGE = "message"


def checked(reply: Reply) -> Reply:
    """Return `reply` if it is `ok: true`.

    Raises:
        ServerError: the matching subclass (`NotFound`, `LeaseLost`, ...) for `ok: false`.
    """
    if reply.get("ok") is True:
        return reply
    raise error_from_reply(reply)


class ClientCore(Generic[W]):
    """Request ids and reply matching for one connection."""

    def __init__(self, framing: Framing, *, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self.framing = framing
        self.max_frame_size = max_frame_size
        self._cutter = FrameCutter(max_frame_size)  # the stream's frames (`Framing.STREAM`)
        self._waiting: dict[str, W] = {}
        self._next = 0
        self.broken: str | None = None
        """Why the peer's byte stream cannot be read any more (an oversize frame), or None."""
        self.unmatched = 0
        """Replies that matched no waiting request (late, after a timeout) or had no reqId."""
        self.ended = False
        """The server sent its goodbye (`protocol._direct.direct_goodbye`: a shard's direct
        port, stopping): no request still waiting was taken, so none was applied."""
        self.on_push: Callable[[Reply], None] | None = None
        """Called with each frame the server sends unasked that names a `type` (a worker's
        `cancel`, docs/protocol.md §8), instead of counting it as unmatched."""

    @property
    def pending(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._waiting)

    def prepare(
        self, commands: Sequence[Mapping[str, Any]], waiters: Sequence[W]
    ) -> tuple[list[str], list[bytes]]:
        """Give each command a `reqId`, remember its waiter, and return the ids and payloads.

        For `Framing.STREAM` the payloads are one bytes object holding every frame (one write);
        for `Framing.MESSAGE` one msgpack body per command. Nothing is registered unless every
        command encodes.

        Raises:
            SerializationError: a command holds a value msgpack cannot encode, or is larger
                than the frame limit.
        """
        if len(commands) != len(waiters):
            raise ValueError("one waiter per command")
        if len(commands) == 1:  # the common case, without the lists
            rid = self._new_id()
            body = self._encode({**commands[0], "reqId": rid})
            self._waiting[rid] = waiters[0]
            return [rid], [body]
        rids = [self._new_id() for _ in commands]
        bodies = [
            self._encode({**cmd, "reqId": rid}) for cmd, rid in zip(commands, rids, strict=True)
        ]
        for rid, waiter in zip(rids, waiters, strict=True):
            self._waiting[rid] = waiter
        if self.framing is Framing.STREAM:
            return rids, [b"".join(bodies)]
        return rids, bodies

    def _encode(self, msg: dict[str, Any]) -> bytes:
        try:
            data = encode(msg) if self.framing is Framing.STREAM else _pack(msg)
        except _ENCODE_ERRORS as e:
            raise SerializationError(f"cannot encode {msg.get('cmd')!r}: {e}") from e
        body = len(data) - 4 if self.framing is Framing.STREAM else len(data)
        if body > self.max_frame_size:
            raise SerializationError(
                f"{msg.get('cmd')!r} is {body} bytes, over the {self.max_frame_size}-byte limit"
            )
        return data

    def feed(self, data: bytes | memoryview) -> list[tuple[W, Reply]]:
        """Take bytes from the stream; return the (waiter, reply) pairs they completed.

        Sets `broken` when the peer sent an oversize frame; the adapter should then close.
        (Replies are trusted more than the server trusts commands: a body is only unpacked,
        and one that is not a map is counted in `unmatched`.)
        """
        if self.broken is not None:
            return []
        cutter = self._cutter
        pairs = cutter.cut(data, self._decode)
        if cutter.oversize is not None:
            self.broken = frame_too_large(cutter.oversize, cutter.max_frame_size)
            self.unmatched += 1
        return [pair for pair in pairs if pair is not None]

    def receive(self, body: bytes) -> tuple[W, Reply] | None:
        """Take one ZeroMQ message body; return its (waiter, reply), or None if it matches
        nothing (undecodable, no reqId, or a request that was given up on)."""
        return self._decode(body)

    def _decode(self, body: bytes | memoryview) -> tuple[W, Reply] | None:
        try:
            reply = msgpack.unpackb(body, raw=False)
        except (ValueError, TypeError):
            self.unmatched += 1
            return None
        if not isinstance(reply, dict):
            self.unmatched += 1
            return None
        return self._match(reply)

    def forget(self, rids: Sequence[str]) -> None:
        """Stop waiting for these requests; a late reply is dropped."""
        for rid in rids:
            self._waiting.pop(rid, None)

    def take(self, rids: Sequence[str]) -> list[W]:
        """Forget these requests and return the waiters of those still waiting."""
        return [self._waiting.pop(rid) for rid in rids if rid in self._waiting]

    def fail_all(self) -> list[W]:
        """Forget every request still waiting and return their waiters (to fail them)."""
        waiters = list(self._waiting.values())
        self._waiting.clear()
        return waiters

    def _match(self, reply: Reply) -> tuple[W, Reply] | None:
        rid = reply.get("reqId")  # kept in the reply: raw callers may want to see it
        if rid is None and reply.get("type") == DIRECT_CLOSING:
            self.ended = True
            return None
        if rid is None and self.on_push is not None and "type" in reply:
            self.on_push(reply)
            return None
        if not isinstance(rid, str) or rid not in self._waiting:
            self.unmatched += 1
            return None
        return self._waiting.pop(rid), reply

    def _new_id(self) -> str:
        self._next += 1
        return str(self._next)


def _pack(msg: Mapping[str, Any]) -> bytes:
    data: bytes = msgpack.packb(msg, use_bin_type=True)
    return data
