"""Live job events over HTTP: server-sent events (`/events`) and the WebSocket (`/ws`).

Each stream is a subscriber of the front end, like any client: it opens an event subscription
of its own there (`shardq.client.AsyncEventStream`), for one queue (`/events/queues/<q>`,
`/ws/queues/<q>`) or all of them. So the event ids are the front end's, the same for every
stream, and an SSE client's `Last-Event-ID` resumes from the front end's ring of recent events
(`events_ring_size`); when that id has already left the ring, the stream says so first with an
`events:gap` event and goes on from the oldest event the ring still holds.

A stream that its client does not read stops reading its subscription, and the front end then
drops events for it (counted) past `events_subscriber_buffer_bytes`: nothing here grows. At most
`events_max_streams` streams (bunqueue's 1,000 for each kind) are open at once; past that a new
one is answered 503. The shapes are bunqueue's (docs/http.md, "Live events").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from typing import Any, Final

import structlog
from aiohttp import WSMsgType, web

from shardq.client import AsyncEventStream, QueueEvent
from shardq.client._url import parse_url
from shardq.protocol import unknown_command
from shardq.protocol._schema import check as schema_check
from shardq.runtime._spec import ChildSpec
from shardq.runtime._tls import loopback_client_context
from shardq.runtime.frontend._auth import INTERNAL_COMMANDS
from shardq.runtime.http._backend import Backend, frontend_url
from shardq.runtime.http._body import BadInput, parse_json

__all__ = ["EventStreams"]

log = structlog.get_logger()

SSE_RETRY_MS: Final = 3_000  # bunqueue's: how long a browser waits before reconnecting
HEARTBEAT_S: Final = 30.0  # bunqueue's SSE heartbeat comment, which also finds dead clients
WS_MAX_MESSAGE: Final = 1 << 20  # bunqueue's cap on one WebSocket message
# bunqueue's event names on SSE and the WebSocket (`pulled` is `job:active` there).
DASHBOARD_NAMES: Final = {
    "pushed": "job:pushed",
    "pulled": "job:active",
    "completed": "job:completed",
    "failed": "job:failed",
    "progress": "job:progress",
    "stalled": "job:stalled",
    "removed": "job:removed",
    "delayed": "job:delayed",
    "duplicated": "job:duplicated",
    "retried": "job:retried",
    "waiting-children": "job:waiting-children",
    "drained": "queue:drained",
}
# The families of bunqueue's WebSocket subscription patterns; shardq emits the job ones.
_FAMILIES: Final = frozenset(
    [
        "job",
        "queue",
        "dlq",
        "flow",
        "cron",
        "worker",
        "ratelimit",
        "concurrency",
        "webhook",
        "batch",
        "client",
        "auth",
        "cleanup",
        "health",
        "stats",
        "storage",
        "server",
        "memory",
        "config",
    ]
)
_PATTERN: Final = re.compile(r"^([a-z]+):([a-z*-]+)$")
MAX_PATTERN_CHARS: Final = 64  # longer than any event name; with ws_max_subscriptions, the bound
# Commands whose `timeout` is a long-poll's wait, which the reply may take on top of the link's.
_WAITS: Final = frozenset({"PULL", "PULLB", "WaitJob"})


def dashboard_name(event: QueueEvent) -> str:
    return DASHBOARD_NAMES.get(event.type, f"job:{event.type}")


def dashboard_data(event: QueueEvent) -> dict[str, Any]:
    """bunqueue's `data` of a job event on SSE and the WebSocket: no payload, no result."""
    data: dict[str, Any] = {"queue": event.queue, "jobId": event.job_id}
    if event.error:
        data["error"] = event.error
    if event.progress is not None:
        data["progress"] = event.progress
    if event.prev:
        data["prev"] = event.prev
    if event.delay is not None:
        data["delay"] = event.delay
    return data


def valid_pattern(pattern: object) -> bool:
    if pattern == "*":
        return True
    if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN_CHARS:
        return False
    found = _PATTERN.match(pattern)
    return found is not None and found.group(1) in _FAMILIES


def matches(name: str, patterns: set[str]) -> bool:
    return "*" in patterns or name in patterns or f"{name.split(':')[0]}:*" in patterns


def _last_event_id(request: web.Request) -> int | None:
    raw = request.headers.get("Last-Event-ID", "").strip()
    return int(raw) if raw.isdigit() else None


class EventStreams:
    """The `/events` and `/ws` handlers, and the count of open streams (for /health)."""

    def __init__(self, spec: ChildSpec, backend: Backend) -> None:
        self._endpoint = parse_url(frontend_url(spec))
        # A TLS front end's certificate is trusted as the HTTP process's backend trusts it.
        self._tls = (
            loopback_client_context(spec.tcp.tls_cert_file) if spec.tcp.tls_cert_file else None
        )
        self._token = spec.tcp.auth_tokens[0] if spec.tcp.auth_tokens else None
        self._backend = backend
        self.max_streams = spec.events.events_max_streams  # lowered to fit the descriptor limit
        self._max_patterns = spec.http.ws_max_subscriptions
        self.open = {"sse": 0, "ws": 0}

    def _subscription(self, queue: str | None, since: int | None) -> AsyncEventStream:
        return AsyncEventStream(
            self._endpoint,
            queue,
            self._token,
            since=since,
            tls_context=self._tls,
            zmq_server_key="",  # its own front end, over TCP: not the client's SHARDQ_* settings
            tls_ca_file="",
        )

    async def _subscribe(
        self, request: web.Request, since: int | None
    ) -> AsyncEventStream | web.Response:
        """The stream's subscription at the front end, in place before this returns; or the
        error response when the front end is down (503) or refuses the queue name (400)."""
        stream = self._subscription(request.match_info.get("queue"), since)
        try:
            await stream.subscribe()
        except Exception as e:
            await stream.close()
            body = {"ok": False, "error": f"Events unavailable: {e}"}
            return web.json_response(body, status=503 if "Server" in str(e) else 400)
        return stream

    def _full(self, kind: str) -> bool:
        return self.open[kind] >= self.max_streams

    # -- server-sent events ----------------------------------------------------------------

    async def sse(self, request: web.Request) -> web.StreamResponse:
        if self._full("sse"):
            return web.Response(text="Too many SSE connections", status=503)
        stream = await self._subscribe(request, _last_event_id(request))
        if isinstance(stream, web.Response):
            return stream
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "Connection": "keep-alive",
            }
        )
        self.open["sse"] += 1
        try:
            await response.prepare(request)
            hello = {"connected": True, "clientId": str(uuid.uuid4())}
            await response.write(f"retry: {SSE_RETRY_MS}\ndata: {json.dumps(hello)}\n\n".encode())
            await self._pump_sse(stream, response)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away
        finally:
            self.open["sse"] -= 1
            await stream.close()
        return response

    async def _pump_sse(self, stream: AsyncEventStream, response: web.StreamResponse) -> None:
        while True:
            event = await stream.get(HEARTBEAT_S)
            if event is None:
                if stream.closed:
                    return
                await response.write(b":heartbeat\n\n")
                continue
            if event.gap:
                gap = {"message": "events after Last-Event-ID were dropped from the ring"}
                await response.write(f"event: events:gap\ndata: {json.dumps(gap)}\n\n".encode())
            data = json.dumps({**dashboard_data(event), "timestamp": event.timestamp})
            line = f"id: {event.id}\nevent: {dashboard_name(event)}\ndata: {data}\n\n"
            await response.write(line.encode())

    # -- WebSocket -------------------------------------------------------------------------

    async def ws(self, request: web.Request) -> web.StreamResponse:
        if self._full("ws"):
            return web.json_response(
                {"ok": False, "error": "Too many WebSocket connections"}, status=503
            )
        # Before the handshake completes: once a client's connect has returned, every event
        # after it reaches the socket, whether or not the client ever sends Subscribe.
        stream = await self._subscribe(request, None)
        if isinstance(stream, web.Response):
            return stream
        socket = web.WebSocketResponse(max_msg_size=WS_MAX_MESSAGE, heartbeat=HEARTBEAT_S)
        try:
            await socket.prepare(request)
        except BaseException:
            await stream.close()
            raise
        # None: a legacy client that never sent Subscribe gets every job event, raw.
        patterns: list[set[str] | None] = [None]
        self.open["ws"] += 1
        pump = asyncio.get_running_loop().create_task(self._pump_ws(stream, socket, patterns))
        try:
            async for message in socket:
                if message.type == WSMsgType.TEXT:
                    await self._on_ws_message_safely(socket, message.data, patterns)
        finally:
            self.open["ws"] -= 1
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
            await stream.close()
        return socket

    async def _pump_ws(
        self, stream: AsyncEventStream, socket: web.WebSocketResponse, patterns: list[Any]
    ) -> None:
        while not socket.closed:
            event = await stream.get()
            if event is None:
                return
            wanted = patterns[0]
            if wanted is None:
                await socket.send_str(json.dumps(dict(event.raw), default=str))
            elif matches(dashboard_name(event), wanted):
                body = {"event": dashboard_name(event), "ts": event.timestamp}
                body["data"] = dashboard_data(event)
                await socket.send_str(json.dumps(body, default=str))

    async def _on_ws_message_safely(
        self, socket: web.WebSocketResponse, text: str, patterns: list[Any]
    ) -> None:
        """A bug met by one message answers an error on the socket: the socket is past its
        HTTP answer, so the middleware's 500 would be written into the stream."""
        try:
            await self._on_ws_message(socket, text, patterns)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:
            log.exception("websocket message failed")
            if not socket.closed:
                error = f"Internal error: {type(e).__name__}"
                await socket.send_json({"ok": False, "error": error})

    async def _on_ws_message(
        self, socket: web.WebSocketResponse, text: str, patterns: list[Any]
    ) -> None:
        try:
            command = parse_json(text)  # bounded: NaN, huge integers and deep nesting refused
        except BadInput as e:
            error = "Invalid JSON" if str(e) == "Invalid JSON body" else str(e)
            await socket.send_json({"ok": False, "error": error})
            return
        if not isinstance(command, dict) or not isinstance(command.get("cmd"), str):
            await socket.send_json({"ok": False, "error": "Invalid command"})
            return
        name, req = command["cmd"], command.pop("reqId", None)
        if name in INTERNAL_COMMANDS:
            # The HTTP process's own link is internal: a client's command must not ride it.
            reply = {"ok": False, "error": unknown_command(name)}
        elif name in ("Subscribe", "Unsubscribe"):
            reply = _subscription_reply(name, command.get("events"), patterns, self._max_patterns)
        else:
            wait = command.get("timeout") if name in _WAITS else None
            wait_ms = wait if isinstance(wait, int | float) and wait > 0 else 0
            # Any command, as on the TCP port, within the same declaration.
            refusal = schema_check(name, command)
            reply = (
                {"ok": False, "error": refusal}
                if refusal
                else await self._backend.call(command, wait_ms=wait_ms)
            )
        if req is not None:
            reply["reqId"] = req
        await socket.send_str(json.dumps(reply, default=str))


def _subscription_reply(
    name: str, events: object, patterns: list[Any], max_patterns: int
) -> dict[str, Any]:
    """bunqueue's Subscribe/Unsubscribe on the WebSocket: patterns such as `job:*`, at most
    `max_patterns` of them, each at most MAX_PATTERN_CHARS long."""
    current: set[str] = patterns[0] if patterns[0] is not None else set()
    if name == "Subscribe":
        if not isinstance(events, list) or not events:
            return {"ok": False, "error": "events must be a non-empty array"}
        invalid = [str(e) for e in events if not valid_pattern(e)]
        if invalid:
            return {"ok": False, "error": f"Invalid: {', '.join(invalid)}"}
        added = current | set(events)
        if len(added) > max_patterns:
            return {"ok": False, "error": f"Too many subscriptions (limit {max_patterns})"}
        current = patterns[0] = added
    elif isinstance(events, list) and events:
        current -= set(map(str, events))
    else:
        current.clear()
    return {"ok": True, "subscribed": sorted(current)}
