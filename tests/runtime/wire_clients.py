"""Raw protocol clients for the process tests: bunqueue TCP frames and a ZeroMQ DEALER.

Deliberately not the project's SDK: these speak the bytes, so the tests see exactly what a
bunqueue client would. Every read has a deadline.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Mapping
from typing import Any

import msgpack  # type: ignore[import-untyped]
import zmq

from shardq.protocol import FrameDecoder, encode_many

__all__ = ["Dealer", "Tcp"]

Reply = dict[str, Any]
_ids = itertools.count(1)


class Tcp:
    """One TCP connection; replies are kept by `reqId` so they may arrive in any order."""

    def __init__(self, address: tuple[str, int], timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.timeout = timeout
        self.decoder = FrameDecoder()
        self.replies: dict[Any, Reply] = {}
        self.unnamed: list[Reply] = []  # frames without reqId (transport errors)
        self.order: list[Any] = []  # reqIds in the order their replies arrived
        self.eof = False

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, *msgs: Mapping[str, Any]) -> list[str]:
        """Send `msgs` in one write, each with a fresh reqId; return the reqIds."""
        reqs = [f"r{next(_ids)}" for _ in msgs]
        self.sock.sendall(encode_many({**m, "reqId": r} for m, r in zip(msgs, reqs, strict=True)))
        return reqs

    def call(self, msg: Mapping[str, Any], timeout: float | None = None) -> Reply:
        (req,) = self.send(msg)
        return self.wait(req, timeout)

    def wait(self, req: str, timeout: float | None = None) -> Reply:
        """The reply to `req`. Raises `TimeoutError` if it does not come in time."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while req not in self.replies:
            if not self._read(deadline):
                raise TimeoutError(f"no reply to {req}")
        reply = dict(self.replies[req])
        del reply["reqId"]
        return reply

    def wait_unnamed(self, timeout: float | None = None) -> Reply:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.unnamed:
            if not self._read(deadline):
                raise TimeoutError("no frame without reqId")
        return self.unnamed.pop(0)

    def wait_eof(self, timeout: float | None = None) -> bool:
        """True once the server closed the connection (read what comes before)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.eof:
            if not self._read(deadline):
                return False
        return True

    def _read(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0 or self.eof:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return False
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return True
        for frame in self.decoder.feed(data):
            assert isinstance(frame, dict), frame
            if "reqId" in frame:
                self.replies[frame["reqId"]] = frame
                self.order.append(frame["reqId"])
            else:
                self.unnamed.append(frame)
        return True


class Dealer:
    """A ZeroMQ DEALER; with `delimiter`, messages carry the empty frame a REQ socket adds."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, *, delimiter: bool = False) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.connect(endpoint)
        self.delimiter = delimiter
        self.replies: dict[Any, Reply] = {}

    def close(self) -> None:
        self.sock.close(linger=0)

    def send(self, msg: Mapping[str, Any]) -> str:
        req = f"z{next(_ids)}"
        body = msgpack.packb({**msg, "reqId": req}, use_bin_type=True)
        self.sock.send_multipart([b"", body] if self.delimiter else [body])
        return req

    def call(self, msg: Mapping[str, Any], timeout: float = 10.0) -> Reply:
        return self.wait(self.send(msg), timeout)

    def wait(self, req: str, timeout: float = 10.0) -> Reply:
        deadline = time.monotonic() + timeout
        while req not in self.replies:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                raise TimeoutError(f"no reply to {req}")
            parts = self.sock.recv_multipart()
            assert (parts[0] == b"") == self.delimiter and len(parts) == 1 + self.delimiter
            frame = msgpack.unpackb(parts[-1], raw=False)
            self.replies[frame.get("reqId")] = frame
        reply = dict(self.replies[req])
        del reply["reqId"]
        return reply
