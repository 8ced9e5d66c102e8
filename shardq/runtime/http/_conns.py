"""The HTTP port's connection bounds (docs/http.md, "Connections").

aiohttp closes an idle keep-alive connection after `keepalive_timeout` (an hour by default,
`http_keepalive_timeout_ms` here) and has no bound of its own on the headers' arrival nor on
the number of connections. `ConnectionGuard` adds them to the aiohttp `Server` (the protocol
factory both sites use):
- headers: a connection whose first request's headers are not complete within
  `http_header_timeout_ms` of its start (for HTTPS: of its handshake's end) is closed, however
  slowly it drips them; later requests on a kept-alive connection are bounded by aiohttp's
  keep-alive timer, which no incoming byte pushes back;
- connections: at most `http_max_connections`, and never more than half of what the
  descriptor limit leaves after `reserved_fds` (a live-event stream costs a second descriptor,
  its subscription). At the cap a new connection evicts the oldest one with no request in
  progress, so idle or silent connections can never keep out a probe of /health; only when
  every connection is busy is the new one closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from shardq.runtime._ports import descriptor_limit
from shardq.runtime.frontend._limits import LogLimiter

__all__ = ["ConnectionGuard", "http_caps"]

log = structlog.get_logger()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_MIN_CAP: Final = 4
# How long a connection whose header timer fired still has to start the request whose bytes
# already came (a few of the event loop's turns).
HEADER_GRACE_S: Final = 0.05


def http_caps(max_connections: int, max_streams: int, reserved_fds: int) -> tuple[int, int]:
    """(connections, streams of each kind) that fit the descriptor limit: every connection
    one descriptor, every stream one more, and `reserved_fds` left for the rest."""
    room = max(2 * _MIN_CAP, descriptor_limit() - reserved_fds)
    return min(max_connections, room // 2), min(max_streams, room // 4)


class _Conn:
    __slots__ = ("busy", "graced", "timer", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.timer: asyncio.TimerHandle | None = None
        self.busy = 0  # requests in progress (a stream's lasts as long as the stream)
        self.graced = False  # the header timer fired once and gave its grace


class ConnectionGuard:
    """Installs itself on an aiohttp `web.Server`; `middleware` must be the outermost."""

    def __init__(self, max_connections: int, header_timeout_s: float) -> None:
        self.max_connections = max(1, max_connections)
        self._header_s = header_timeout_s
        self._conns: dict[Any, _Conn] = {}  # RequestHandler -> state, oldest first
        self._refused_log = LogLimiter("http connection refused: every connection busy")
        self.evicted = 0
        self.refused = 0

    def __len__(self) -> int:
        return len(self._conns)

    def install(self, server: web.Server) -> None:
        made, lost, factory = server.connection_made, server.connection_lost, server.request_factory

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._made(handler, transport)

        def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
            self._lost(handler)
            lost(handler, exc)

        def request_factory(*args: Any) -> Any:
            # The headers of a request are complete: its connection has spoken in time.
            conn = self._conns.get(args[2])
            if conn is not None and conn.timer is not None:
                conn.timer.cancel()
                conn.timer = None
            return factory(*args)

        # Instance attributes: `RequestHandler` calls them through its manager.
        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]
        server.request_factory = request_factory

    def _made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        if len(self._conns) >= self.max_connections and not self._evict_one():
            self.refused += 1
            self._refused_log.log(max_connections=self.max_connections)
            transport.abort()
            return
        conn = self._conns[handler] = _Conn(transport)
        loop = asyncio.get_running_loop()
        conn.timer = loop.call_later(self._header_s, self._headers_late, handler)

    def _evict_one(self) -> bool:
        for handler, conn in self._conns.items():
            if conn.busy == 0:
                self.evicted += 1
                self._drop(handler, conn)
                return True
        return False

    def _drop(self, handler: Any, conn: _Conn) -> None:
        del self._conns[handler]
        if conn.timer is not None:
            conn.timer.cancel()
        conn.transport.abort()

    def _headers_late(self, handler: Any) -> None:
        conn = self._conns.get(handler)
        if conn is None or conn.busy != 0:
            return
        if not conn.graced:
            # After a stall of this process past the timer, headers that came in time are
            # read in the very turn the timer fires, and their request starts a turn or two
            # later (cancelling this timer): one short grace for them, then the close.
            conn.graced = True
            loop = asyncio.get_running_loop()
            conn.timer = loop.call_later(HEADER_GRACE_S, self._headers_late, handler)
            return
        conn.timer = None
        self._drop(handler, conn)

    def _lost(self, handler: Any) -> None:
        conn = self._conns.pop(handler, None)
        if conn is not None and conn.timer is not None:
            conn.timer.cancel()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self._conns.get(request.protocol)
        if conn is not None:
            conn.busy += 1
        try:
            return await handler(request)
        finally:
            if conn is not None:
                conn.busy -= 1
