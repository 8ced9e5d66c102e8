"""The HTTP process: an aiohttp server on `http_port`; see the package docstring.

Auth follows bunqueue: with `auth_tokens` set, every route but /health, /healthz, /live and
/ready (and /prometheus unless `metrics_auth`) wants `Authorization: Bearer <token>`, else
`401 {ok: false, error: "Unauthorized"}`. The dashboard's own files (/, /static/...) carry no
data and are served to anyone; the page asks for the token and sends it with its API calls.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import signal
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any, Final

import structlog
import zmq
from aiohttp import web

from shardq.protocol._fields import schema_limits
from shardq.runtime._child import SpecError, SupervisorLink, parse_spec_args
from shardq.runtime._logging import configure
from shardq.runtime._spec import ChildSpec
from shardq.runtime._tls import server_context
from shardq.runtime.http._backend import Backend
from shardq.runtime.http._body import BadInput, BodyReader, parse_json
from shardq.runtime.http._charts import Charts
from shardq.runtime.http._conns import ConnectionGuard, http_caps
from shardq.runtime.http._edge import Edge
from shardq.runtime.http._mcp import McpEndpoint
from shardq.runtime.http._monitor import Monitor
from shardq.runtime.http._overview import Overview
from shardq.runtime.http._rest import match, rest_error, status_for
from shardq.runtime.http._streams import EventStreams
from shardq.runtime.http._tls_site import TlsSite
from shardq.runtime.http._webhooks import WebhookService

__all__ = ["build_app", "main", "serve"]

log = structlog.get_logger()

_OPEN: Final = frozenset({"/health", "/healthz", "/live", "/ready"})
_PAGE: Final = frozenset({"/", "/favicon.ico"})  # the dashboard's own files: no data in them
_PROMETHEUS_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# A request still running at SIGTERM gets this long: the front end stops with us, so what
# waits on it fails at once; only a slow client's transfer could take longer.
_STOP_GRACE_S: Final = 2.0
_MAX_SUSPECTS: Final = 100_000  # addresses remembered for a recent failed bearer token
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: Any, status: int = 200) -> web.Response:
    # default=str: a reply may carry values JSON has no type for (bytes from msgpack).
    return web.Response(
        text=json.dumps(body, default=str), status=status, content_type="application/json"
    )


def _error(status: int, message: str) -> web.Response:
    return _json({"ok": False, "error": message}, status)


class _Auth:
    """Bearer tokens. A token that matches is let through here, unless its address failed
    recently: then, like every token that does not match, it is checked by the front end
    (`AuthCheck`), which counts failures per address over every port and answers only after
    the address's delay (docs/protocol.md §3.2). A missing token is no guess: 401 at once."""

    def __init__(self, spec: ChildSpec, backend: Backend) -> None:
        self._tokens = [t.encode() for t in spec.tcp.auth_tokens]
        self._metrics_auth = spec.http.metrics_auth
        self._backend = backend
        self._window_s = spec.tcp.auth_failure_window_ms / 1000
        self._wait_ms = spec.tcp.auth_failure_max_delay_ms
        self._suspects: OrderedDict[str, float] = OrderedDict()  # address -> until

    async def denied(self, request: web.Request) -> web.Response | None:
        path = request.path
        if path in _OPEN or path in _PAGE or path.startswith("/static/"):
            return None
        if path == "/prometheus" and not self._metrics_auth:
            return None
        if path == "/prometheus" and not self._tokens:
            return _error(503, "Metrics authentication is enabled but no tokens are configured")
        if not self._tokens:
            return None
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _error(401, "Unauthorized")
        address = request.remote or ""
        if not self._suspect(address) and self._bearer_ok(token):
            return None
        reply = await self._backend.call(
            {"cmd": "AuthCheck", "token": token, "address": address}, wait_ms=self._wait_ms
        )
        if reply.get("ok") is True:
            return None
        error = str(reply.get("error", ""))
        if error.startswith("Server unavailable"):
            return _error(503, "Server unavailable: cannot check the token")
        if error.startswith("Too many failed"):  # not even checked: the address must wait
            response = _error(429, error)
            response.headers["Retry-After"] = str(max(1, self._wait_ms // 1000))
            return response
        self._suspects[address] = time.monotonic() + self._window_s
        self._suspects.move_to_end(address)
        if len(self._suspects) > _MAX_SUSPECTS:
            self._suspects.popitem(last=False)
        return _error(401, "Unauthorized")

    def _suspect(self, address: str) -> bool:
        until = self._suspects.get(address)
        if until is None:
            return False
        if until < time.monotonic():
            del self._suspects[address]
            return False
        return True

    def _bearer_ok(self, token: str) -> bool:
        given = token.encode()
        # Compare against every token, always: the time taken says nothing about which matched.
        return any([hmac.compare_digest(given, t) for t in self._tokens])


def _wants_prometheus(request: web.Request) -> bool:
    """A Prometheus scraper pointed at /metrics asks for text; anything else gets JSON."""
    accept = request.headers.get("Accept", "")
    text = "text/plain" in accept or "openmetrics" in accept
    return request.query.get("format") == "prometheus" or (text and "json" not in accept)


class _Server:
    def __init__(self, spec: ChildSpec, backend: Backend) -> None:
        self.spec = spec
        self.backend = backend
        self.monitor = Monitor(spec, backend)
        self.overview = Overview(backend, self.monitor)
        self.limits = schema_limits(spec.engine)
        # Routes and MCP tools send their commands through it: it answers the dashboard's own.
        self.charts = Charts(backend, spec.http.metrics_max_queues, self.limits)
        # AuthCheck and WebhookSync are served only on an internal link, never on the one
        # clients' commands use; this process opens one, shared by both.
        self.internal = Backend(spec, internal=True)
        self.auth = _Auth(spec, self.internal)
        self.bodies = BodyReader(
            spec.http.http_max_body_bytes,
            spec.http.http_max_body_bytes_in_flight,
            spec.http.http_body_timeout_ms / 1000,
        )
        self.streams = EventStreams(spec, backend)
        self.monitor.streams_open = self.streams.open
        self.webhooks = WebhookService(spec, self.internal)
        self.mcp = McpEndpoint(self.charts, spec.tcp.max_frame_bytes)

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        denied = await self.auth.denied(request)
        if denied is not None:
            return denied
        try:
            return await handler(request)
        except BadInput as e:
            response = _error(e.status, str(e))
            if e.status in (408, 413):
                response.force_close()  # the rest of the body is not read: no keep-alive
            return response
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
            return _error(404, "Not found")
        except web.HTTPException:
            raise  # aiohttp's own answers (a body over the size cap: 413)
        except Exception as e:  # a bug here must not become an HTML page or a dead process
            log.exception("http request failed", path=request.path)
            return _error(500, f"Internal error: {type(e).__name__}")

    async def health(self, request: web.Request) -> web.Response:
        status, body = await self.monitor.health()
        return _json(body, status)

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def ready(self, request: web.Request) -> web.Response:
        status, body = await self.monitor.ready()
        return _json(body, status)

    async def prometheus(self, request: web.Request) -> web.Response:
        body = await self.monitor.prometheus(self.webhooks.collector())
        return web.Response(body=body, headers={"Content-Type": _PROMETHEUS_TYPE})

    async def metrics(self, request: web.Request) -> web.Response:
        if _wants_prometheus(request):
            return await self.prometheus(request)
        return _json(await self.monitor.metrics_json())

    async def stats(self, request: web.Request) -> web.Response:
        return _json(await self.monitor.stats())

    async def queues_summary(self, request: web.Request) -> web.Response:
        status, body = await self.monitor.queues_summary()
        return _json(body, status)

    async def dashboard(self, request: web.Request) -> web.Response:
        return _json(await self.overview.overview())

    async def dashboard_queues(self, request: web.Request) -> web.Response:
        query = request.query
        return _json(await self.overview.queues(query.get("limit"), query.get("offset")))

    async def dashboard_queue(self, request: web.Request) -> web.Response:
        include = request.query.get("includeJobs") == "true"
        return _json(await self.overview.queue(request.match_info["queue"], include))

    async def favicon(self, request: web.Request) -> web.StreamResponse:
        icon = resources.files("shardq.runtime.http").joinpath("static/favicon.svg")
        return web.Response(body=icon.read_bytes(), content_type="image/svg+xml")

    async def index(self, request: web.Request) -> web.StreamResponse:
        page = resources.files("shardq.runtime.http").joinpath("static/index.html")
        return web.Response(text=page.read_text(), content_type="text/html")

    async def rest(self, request: web.Request) -> web.Response:
        found = match(request.method, request.path)
        if found is None:
            return _error(404, "Not found")
        route, captures = found
        raw = await self.bodies.read(request) if request.can_read_body else b""
        try:
            body: Any = parse_json(raw) if raw else {}
            if not isinstance(body, dict):
                return _error(400, "Invalid JSON body")
            command = route.build(captures, request.query, body)
            # The same declaration as the TCP port's, checked before the command leaves.
            error = rest_error(command, self.limits)
            if error:
                return _error(400, error)
            wait = command.get(route.wait_key) if route.wait_key else None
            wait_ms = wait if isinstance(wait, int | float) and wait > 0 else 0
            reply = await self.charts.call(command, wait_ms=wait_ms)
            return _json(reply, status_for(route, reply))
        finally:
            self.bodies.release(len(raw))


def build_app(
    spec: ChildSpec, backend: Backend, guard: ConnectionGuard | None = None
) -> web.Application:
    server = _Server(spec, backend)
    edge = Edge(spec)
    middlewares = [edge.guard, server.guard]
    if guard is not None:
        middlewares.insert(0, guard.middleware)
    _, server.streams.max_streams = http_caps(
        spec.http.http_max_connections, spec.events.events_max_streams, spec.tcp.reserved_fds
    )
    # Bodies are read by `BodyReader` within http_max_body_bytes; this is aiohttp's own cap
    # for any other read, the same.
    app = web.Application(middlewares=middlewares, client_max_size=spec.http.http_max_body_bytes)
    app.on_response_prepare.append(edge.add_cors)
    static = resources.files("shardq.runtime.http").joinpath("static")
    app.router.add_get("/health", server.health)
    app.router.add_get("/healthz", server.live)
    app.router.add_get("/live", server.live)
    app.router.add_get("/ready", server.ready)
    app.router.add_get("/prometheus", server.prometheus)
    app.router.add_get("/metrics", server.metrics)
    app.router.add_get("/stats", server.stats)
    app.router.add_get("/queues/summary", server.queues_summary)
    app.router.add_get("/dashboard", server.dashboard)
    app.router.add_get("/dashboard/queues", server.dashboard_queues)
    app.router.add_get("/favicon.ico", server.favicon)
    app.router.add_get("/dashboard/queues/{queue}", server.dashboard_queue)
    for path in ("/events", "/events/queues/{queue}"):
        app.router.add_get(path, server.streams.sse)
    for path in ("/ws", "/ws/queues/{queue}"):
        app.router.add_get(path, server.streams.ws)
    app.router.add_get("/", server.index)
    app.router.add_static("/static/", str(static))
    app.router.add_route("*", "/mcp", server.mcp.handle)
    app.cleanup_ctx.append(server.mcp.lifespan)
    app.router.add_route("*", "/{tail:.*}", server.rest)
    # Webhook delivery lives and dies with the HTTP server (docs/protocol.md, "Webhooks").
    app.on_startup.append(lambda _app: server.webhooks.start())
    app.on_cleanup.append(lambda _app: server.webhooks.stop())
    app.on_cleanup.append(lambda _app: server.internal.close())
    return app


async def serve(spec: ChildSpec) -> int:
    """Listen until SIGTERM; return the exit code."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sup = SupervisorLink(ctx, spec)
    backend = Backend(spec)
    # Before anything can fail or take time: a SIGTERM at start-up is a clean stop too.
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    max_connections, _ = http_caps(
        spec.http.http_max_connections, spec.events.events_max_streams, spec.tcp.reserved_fds
    )
    guard = ConnectionGuard(max_connections, spec.http.http_header_timeout_ms / 1000)
    runner = web.AppRunner(
        build_app(spec, backend, guard),
        access_log=None,
        keepalive_timeout=spec.http.http_keepalive_timeout_ms / 1000,
    )
    await runner.setup()
    assert runner.server is not None  # set by setup
    guard.install(runner.server)
    tls_site: TlsSite | None = None
    try:
        site: web.BaseSite | TlsSite
        if spec.tcp.tls_cert_file:
            context = server_context(spec.tcp.tls_cert_file, spec.tcp.tls_key_file)
            site = tls_site = TlsSite(
                runner, spec.tcp.host, spec.http.http_port, context,
                timeout_s=spec.http.http_header_timeout_ms / 1000, max_pending=max_connections,
            )  # fmt: skip
        else:
            site = web.TCPSite(
                runner, spec.tcp.host, spec.http.http_port, reuse_address=True,
                shutdown_timeout=_STOP_GRACE_S,
            )  # fmt: skip
        try:
            await site.start()
        except OSError as e:
            log.error("http cannot bind", error=str(e))
            sup.fatal(f"http cannot bind port {spec.http.http_port}: {e}")
            return 1
        sup.ready(addresses={"http": f"{spec.tcp.host}:{spec.http.http_port}"})
        log.info(
            "http ready", host=spec.tcp.host, port=spec.http.http_port, tls=tls_site is not None,
            max_connections=max_connections,
        )  # fmt: skip
        await stop.wait()
        log.info("http stopped")
        return 0
    finally:
        if tls_site is not None:
            await tls_site.stop()
        await runner.cleanup()
        await backend.close()
        sup.close()
        ctx.term()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m shardq.runtime.http --spec JSON`; returns the exit code."""
    try:
        spec = parse_spec_args(sys.argv[1:] if argv is None else argv)
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    configure("http", spec.process.log_format, spec.process.log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return asyncio.run(serve(spec))
