"""A synchronous TCP connection that speaks the bunqueue framing, with pipelining.

Many requests may be in flight at once: each gets a string `reqId` and replies are matched by
it, whatever order they come back in (the server answers out of order).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping
from typing import Any

from shardq.errors import ShardqError
from shardq.protocol import FrameDecoder, encode_many

__all__ = ["CommandFailed", "ConnectionClosed", "TcpConnection"]

_RECV_BYTES = 1 << 20


class ConnectionClosed(ShardqError):
    """The server closed the connection, or it timed out, before every reply arrived."""


class CommandFailed(ShardqError):
    """The server answered `ok: false`; `str(err)` is its error string."""

    def __init__(self, reply: Mapping[str, Any]) -> None:
        super().__init__(str(reply.get("error")))
        self.reply = reply


class TcpConnection:
    """One TCP connection to a shardq (or bunqueue) server."""

    def __init__(self, host: str, port: int, *, timeout: float = 30.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._decoder = FrameDecoder()
        self._next_id = 0
        self._early: dict[str, dict[str, Any]] = {}

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> TcpConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, command: Mapping[str, Any], *, check: bool = True) -> dict[str, Any]:
        """Send one command and wait for its reply.

        Raises:
            CommandFailed: the reply was `ok: false` and `check` is true.
            ConnectionClosed: the connection closed or timed out first.
        """
        return self.call_many([command], check=check)[0]

    def call_many(
        self, commands: Iterable[Mapping[str, Any]], *, window: int = 1000, check: bool = True
    ) -> list[dict[str, Any]]:
        """Pipeline commands, at most `window` in flight; replies in the order of `commands`.

        Raises:
            CommandFailed: some reply was `ok: false` and `check` is true.
            ConnectionClosed: the connection closed or timed out first.
        """
        pending = list(commands)
        replies: list[dict[str, Any] | None] = [None] * len(pending)
        slots: dict[str, int] = {}
        sent = 0
        while sent < len(pending) or slots:
            batch = []
            while sent < len(pending) and len(slots) < window:
                rid = self._new_id()
                slots[rid] = sent
                batch.append({**pending[sent], "reqId": rid})
                sent += 1
            if batch:
                self._sock.sendall(encode_many(batch))
            for reply in self._read():
                index = slots.pop(str(reply.get("reqId")), None)
                if index is not None:
                    replies[index] = reply
        done = [r for r in replies if r is not None]
        if check:
            for reply in done:
                if not reply.get("ok"):
                    raise CommandFailed(reply)
        return done

    def _new_id(self) -> str:
        self._next_id += 1
        return str(self._next_id)

    def _read(self) -> list[dict[str, Any]]:
        try:
            data = self._sock.recv(_RECV_BYTES)
        except (TimeoutError, OSError) as e:
            raise ConnectionClosed(f"no reply: {e}") from e
        if not data:
            raise ConnectionClosed("the server closed the connection")
        return [frame for frame in self._decoder.feed(data) if isinstance(frame, dict)]
