"""What every request to the HTTP port passes first: bunqueue's CORS answers and its per-IP
rate limit (docs/http.md, "CORS" and "Rate limit").

CORS: every answer carries `Access-Control-Allow-Origin`, and `OPTIONS` on any path is a
preflight answered at once (204, no token asked, not counted by the limit), as bunqueue does.
With the default `cors_allow_origin` of `*` the header says `*`. With a list, bunqueue sends
the whole list joined by commas, which no browser accepts; shardq sends the request's own
`Origin` when it is on the list (and `Vary: Origin`, so a cache keeps answers apart), and no
header otherwise, which is what the setting promises.

Rate limit: at most `http_rate_limit_max_requests` requests per `http_rate_limit_window_ms`
per client address, past which `429 {ok: false, error: "Rate limit exceeded"}` with
`Retry-After`. The probes, `/prometheus` and the dashboard's own files are never limited (a
load balancer or a scraper must never be refused for asking too often). bunqueue keys the
limit by `X-Forwarded-For` or `X-Real-IP`, which any client can set to escape it, and puts
every client without them in one bucket; shardq keys it by the connection's peer address.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from shardq.runtime._spec import ChildSpec

__all__ = ["Edge", "IpLimiter"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Never rate limited: what probes and scrapers ask, and files that carry no data.
_UNLIMITED: Final = frozenset({"/health", "/healthz", "/live", "/ready", "/prometheus", "/"})
_PREFLIGHT: Final = {
    "Access-Control-Allow-Methods": "GET, POST, PUT, DELETE, OPTIONS",
    # bunqueue's two, and the header an EventSource sends when it resumes a stream.
    "Access-Control-Allow-Headers": "Content-Type, Authorization, Last-Event-ID",
    "Access-Control-Max-Age": "86400",  # bunqueue's: a day
}


class IpLimiter:
    """At most `limit` requests per `window_ms` for each client address: a fixed window per
    address, as the TCP port's per-connection limit counts."""

    def __init__(self, window_ms: int, limit: int) -> None:
        self._window = window_ms / 1000
        self._limit = limit
        self._clients: dict[str, list[float]] = {}  # address -> [window end, count]
        self._sweep_at = 0.0

    def wait_s(self, address: str, now: float) -> float:
        """Count one request from `address` at monotonic `now`: 0 if it may pass, else the
        seconds until its window ends."""
        if now >= self._sweep_at:
            # Once a window: forget the addresses whose window is over, so the table holds
            # only the clients of the last window.
            self._clients = {a: c for a, c in self._clients.items() if c[0] > now}
            self._sweep_at = now + self._window
        client = self._clients.get(address)
        if client is None or now >= client[0]:
            self._clients[address] = [now + self._window, 1]
            return 0.0
        client[1] += 1
        return 0.0 if client[1] <= self._limit else client[0] - now

    def __len__(self) -> int:
        return len(self._clients)


class Edge:
    def __init__(self, spec: ChildSpec) -> None:
        origins = spec.http.cors_allow_origin
        self._any_origin = "*" in origins
        self._origins = frozenset(origins)
        window = spec.http.http_rate_limit_window_ms
        self.limiter = IpLimiter(window, spec.http.http_rate_limit_max_requests) if window else None

    def allowed_origin(self, origin: str | None) -> str | None:
        if self._any_origin:
            return "*"
        return origin if origin in self._origins else None

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS":
            return web.Response(status=204, headers=_PREFLIGHT)
        limiter = self.limiter
        path = request.path
        if limiter is not None and path not in _UNLIMITED and not path.startswith("/static/"):
            wait = limiter.wait_s(request.remote or "", time.monotonic())
            if wait:
                return web.Response(
                    text=json.dumps({"ok": False, "error": "Rate limit exceeded"}),
                    status=429,
                    content_type="application/json",
                    headers={"Retry-After": str(max(1, round(wait)))},
                )
        return await handler(request)

    async def add_cors(self, request: web.Request, response: web.StreamResponse) -> None:
        """on_response_prepare: every answer, streams and upgrades included."""
        headers = response.headers
        if "Access-Control-Allow-Origin" in headers:
            return  # a handler that chose its own
        allowed = self.allowed_origin(request.headers.get("Origin"))
        if not self._any_origin:
            headers.add("Vary", "Origin")
        if allowed is not None:
            headers["Access-Control-Allow-Origin"] = allowed
