"""`TcpConnection`: the smallest client, a blocking single-threaded socket with pipelining.

For benchmarks and raw protocol work: no threads, no reconnects, no retries. Many requests
may be in flight at once (`call_many`); replies are matched by `reqId` through the same
`ClientCore` the other transports use, whatever order they come back in.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from shardq.client._core import ClientCore, Framing
from shardq.client._errors import CommandTimeout, ConnectionLost, ServerError, error_from_reply
from shardq.client._sockets import connect_tcp
from shardq.client._url import ClientSecurity, Endpoint

__all__ = ["CommandFailed", "ConnectionClosed", "TcpConnection"]

_RECV_BYTES: Final = 1 << 20

ConnectionClosed = ConnectionLost
"""The name this error had before the client grew its error tree."""

CommandFailed = ServerError
"""The name this error had before the client grew its error tree."""


class TcpConnection:
    """One TCP connection to a shardq (or bunqueue) server; use from one thread."""

    def __init__(self, host: str, port: int, *, timeout: float = 30.0) -> None:
        """Connect. Raises `ConnectionLost` if the server cannot be reached in `timeout`."""
        try:
            self._sock = connect_tcp(Endpoint("tcp", host, port), timeout, ClientSecurity())
        except OSError as e:
            raise ConnectionLost(f"cannot connect to {host}:{port}: {e}", sent=False) from e
        self._timeout = timeout
        self._core: ClientCore[int] = ClientCore(Framing.STREAM)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> TcpConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, command: Mapping[str, Any], *, check: bool = True) -> dict[str, Any]:
        """Send one command and wait for its reply.

        Raises:
            ServerError: the reply was `ok: false` and `check` is true (`CommandFailed`).
            CommandTimeout: no reply within the timeout.
            ConnectionLost: the connection closed first (`ConnectionClosed`).
        """
        return self.call_many([command], check=check)[0]

    def call_many(
        self, commands: Iterable[Mapping[str, Any]], *, window: int = 1000, check: bool = True
    ) -> list[dict[str, Any]]:
        """Pipeline commands, at most `window` in flight; replies in the order of `commands`.

        Raises what `call` raises; with `check`, for the first `ok: false` reply in order.
        """
        pending = list(commands)
        replies: list[dict[str, Any] | None] = [None] * len(pending)
        sent = 0
        while sent < len(pending) or self._core.pending:
            batch = list(range(sent, min(len(pending), sent + window - self._core.pending)))
            if batch:
                _, payloads = self._core.prepare([pending[i] for i in batch], batch)
                self._send(payloads[0])
                sent += len(batch)
            for index, reply in self._read():
                replies[index] = reply
        done = [r for r in replies if r is not None]
        if check:
            for reply in done:
                if reply.get("ok") is not True:
                    raise error_from_reply(reply)
        return done

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as e:
            raise ConnectionLost(f"send failed: {e}") from e

    def _read(self) -> list[tuple[int, dict[str, Any]]]:
        started = time.monotonic()
        try:
            data = self._sock.recv(_RECV_BYTES)
        except TimeoutError:
            self._core.fail_all()
            waited = time.monotonic() - started
            raise CommandTimeout(f"no reply within {waited:.3g} s") from None
        except OSError as e:
            raise ConnectionLost(f"no reply: {e}") from e
        if not data:
            raise ConnectionLost("the server closed the connection")
        matched = self._core.feed(data)
        if self._core.broken is not None:
            raise ConnectionLost(f"bad frame from the server: {self._core.broken}")
        return matched
