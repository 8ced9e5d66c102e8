"""A raw bunqueue TCP client for the adversarial suites: bytes in, replies checked, a close
accepted. Deliberately not the project's SDK: garbage has to reach the server as sent.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from typing import Any

import msgpack
from shardq_harness import ShardqServer

from shardq.protocol import FrameDecoder

__all__ = ["REPLY_S", "Conn", "deep", "frame", "pack", "raw_map"]

REPLY_S = 10.0  # how long a live server may take to answer on a loaded 2-core machine

Reply = dict[str, Any]


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


class Conn:
    """A raw TCP connection that tolerates being closed on: replies by reqId, EOF noted."""

    def __init__(self, server: ShardqServer) -> None:
        self.sock = socket.create_connection(server.tcp_address, timeout=REPLY_S)
        self.decoder = FrameDecoder(64 << 20)
        self.replies: dict[Any, Reply] = {}
        self.other: list[Any] = []  # frames without a usable reqId
        self.eof = False

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> bool:
        """Write `data`; False when the server already closed the connection."""
        try:
            self.sock.sendall(data)
        except OSError:
            self.eof = True
            return False
        return True

    def wait(self, req: str, timeout: float = REPLY_S, *, or_unnamed: bool = False) -> Reply | None:
        """The reply to `req`, or None if the connection closed first (or, with `or_unnamed`,
        a frame without reqId came: the answer to a body that does not decode).

        Raises `TimeoutError` when none of these comes in time: the server is wedged.
        """
        deadline = time.monotonic() + timeout
        while req not in self.replies and not self.eof and not (or_unnamed and self.other):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply to {req} and no close within {timeout}s")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self.eof = True
            for item in self.decoder.feed(data):
                self._keep(item)
        return self.replies.get(req)

    def _keep(self, item: Any) -> None:
        assert isinstance(item, dict), f"the server sent a non-map frame: {item!r}"
        assert isinstance(item.get("ok"), bool), f"a reply without ok: {item!r}"
        if item["ok"] is False:
            assert isinstance(item.get("error"), str), item
        req = item.get("reqId")
        if isinstance(req, str):
            self.replies[req] = item
        else:
            self.other.append(item)

    def call(self, cmd: dict[str, Any], timeout: float = REPLY_S) -> Reply:
        req = uuid.uuid4().hex
        assert self.send(frame(pack({**cmd, "reqId": req})))
        reply = self.wait(req, timeout)
        assert reply is not None, f"connection closed instead of answering {cmd['cmd']}"
        return reply


def deep(depth: int) -> bytes:
    """msgpack for a list nested `depth` deep (deeper than msgpack's packer will write)."""
    return b"\x91" * depth + b"\xc0"


def raw_map(items: list[tuple[str, bytes]]) -> bytes:
    """A msgpack map from already packed values (so a value may be nested past the packer's
    limit). Keys are unique: the last value wins, as a decoder would keep it."""
    kept = dict(items)
    body = b"".join(pack(k) + v for k, v in kept.items())
    n = len(kept)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)
    return head + body
