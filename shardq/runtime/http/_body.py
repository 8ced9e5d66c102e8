"""REST bodies and WebSocket messages: bounded while read, refused clearly when bad
(docs/http.md, "Bodies").

- A body over `http_max_body_bytes` is answered 413 before it is read when its
  `Content-Length` says so, and as soon as the bytes read pass the bound otherwise; the
  connection is then closed rather than drained. The bodies being read at once share
  `http_max_body_bytes_in_flight`: past it a new one is answered 503 (retry later). A body must
  arrive within `http_body_timeout_ms`. A body's bytes count until its request is answered
  (its parsed value is alive until then).
- JSON is read strictly (`shardq.protocol._json`): nesting too deep, integers outside the
  64-bit range (the wire cannot carry them), `NaN`, `Infinity` and floats that overflow to
  infinity are refused with 400 `Invalid JSON body: <why>`, as malformed JSON is.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from aiohttp import web

from shardq.protocol._json import loads as json_loads

__all__ = ["BadInput", "BodyReader", "parse_json"]

INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**64 - 1


class BadInput(ValueError):
    """A body, message or query value that is refused; the message is the client's answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_json(raw: bytes | str) -> Any:
    """The JSON value of `raw`; `BadInput` for malformed JSON or values the server refuses.
    The reading itself is the protocol's one strict JSON reader (`shardq.protocol._json`)."""
    try:
        return json_loads(raw)
    except ValueError as e:
        raise BadInput(str(e).replace("Invalid JSON", "Invalid JSON body", 1)) from None


def query_int(text: str | None, default: int | None = None) -> int | None:
    """A query parameter as an int: `default` when absent or not a number (bunqueue's
    leniency), `BadInput` when a number too large for the wire."""
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        return default
    if not INT_MIN <= value <= INT_MAX:
        raise BadInput("Invalid number: integers must fit in 64 bits")
    return value


class BodyReader:
    """Reads request bodies within the per-body and the shared in-flight byte bounds."""

    def __init__(self, max_bytes: int, max_in_flight: int, timeout_s: float) -> None:
        self.max_bytes = max_bytes
        self._max_in_flight = max_in_flight
        self._timeout = timeout_s
        self.in_flight = 0  # bytes of bodies being read now, all requests together

    def _too_large(self) -> BadInput:
        return BadInput(f"Request body too large (limit {self.max_bytes} bytes)", 413)

    def release(self, size: int) -> None:
        """The request whose body of `size` bytes `read` returned is over."""
        self.in_flight -= size

    async def read(self, request: web.Request) -> bytes:
        """The whole body, counted in `in_flight` until `release`d; `BadInput` (413, 503 or
        408) when it may not be read whole."""
        length = request.content_length
        if length is not None and length > self.max_bytes:
            raise self._too_large()
        taken = 0
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout(self._timeout):
                async for chunk in request.content.iter_any():
                    size = len(chunk)
                    if taken + size > self.max_bytes:
                        raise self._too_large()
                    if self.in_flight + size > self._max_in_flight:
                        raise BadInput("Server busy: too many request bodies being read", 503)
                    self.in_flight += size
                    taken += size
                    chunks.append(chunk)
        except BaseException as e:
            self.in_flight -= taken
            if isinstance(e, TimeoutError):
                raise BadInput("Request body not received in time", 408) from None
            raise
        return b"".join(chunks)
