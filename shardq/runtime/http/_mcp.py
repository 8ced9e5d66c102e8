"""`/mcp`: the Model Context Protocol over Streamable HTTP, on the HTTP port.

AI agents list and call shardq's commands as MCP tools (`_mcp_tools`: one per REST route).
The `mcp` package serves the protocol; it is an ASGI application, so `handle` passes each
aiohttp request through to it and its answer back. It runs stateless with JSON answers: every
POST is a whole exchange (no session to keep, nothing held between requests), which suits a
request/reply command set and keeps this process's memory bounded by the requests in flight.
The route sits behind the same auth middleware as the REST routes (`Authorization: Bearer`).

The package is an extra (`pip install 'shardq[mcp]'`): without it `/mcp` answers 501 saying so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, MutableMapping
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDict

from shardq._version import __version__
from shardq.runtime.http._mcp_tools import ToolSpec, tool_specs

__all__ = ["McpEndpoint"]

MISSING = "MCP needs the mcp package: pip install 'shardq[mcp]'"


class Caller(Protocol):
    """What answers a tool's command: the HTTP process's `Charts` (the dashboard's own
    commands) in front of its `Backend` (every other, by the front end)."""

    async def call(self, command: Mapping[str, Any], *, wait_ms: float = 0) -> dict[str, Any]:
        """The command's reply."""


def _load() -> tuple[Any, Any] | None:
    """The protocol's server and session manager classes, or None without the package."""
    try:
        from mcp.server.lowlevel import Server
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    except ImportError:
        return None
    return Server, StreamableHTTPSessionManager


class McpEndpoint:
    """Started at the first `/mcp` request: the package takes a second or two to import and
    tens of MB, which a server nobody asks for MCP should not pay at every start."""

    def __init__(self, backend: Caller, max_body_bytes: int) -> None:
        self._backend = backend
        self._max_body = max_body_bytes
        self._tools = {spec.name: spec for spec in tool_specs()}
        self._manager: Any = None
        self._missing = False
        self._starting = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def lifespan(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp's cleanup context: a started session manager stops with the app."""
        yield
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _started(self) -> Any:
        async with self._starting:
            if self._manager is None and not self._missing:
                # In a thread: the import must not hold up the requests of the other routes.
                classes = await asyncio.to_thread(_load)
                if classes is None:
                    self._missing = True
                else:
                    ready = asyncio.Event()
                    self._task = asyncio.create_task(self._serve(*classes, ready))
                    await ready.wait()
        return self._manager

    async def _serve(self, server_class: Any, manager_class: Any, ready: asyncio.Event) -> None:
        """Runs the session manager, in one task from start to stop (its task group is
        anyio's, which must be left by the task that entered it)."""
        server = server_class(
            "shardq",
            version=__version__,
            instructions="Operate a shardq job queue server: one tool per command.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        manager = manager_class(
            app=server, json_response=True, stateless=True, max_request_body_size=self._max_body
        )
        try:
            async with manager.run():
                self._manager = manager
                ready.set()
                await self._stop.wait()
        finally:
            self._manager = None
            ready.set()  # a manager that failed to start leaves /mcp answering 501

    async def _list_tools(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types

        return types.ListToolsResult(tools=[_tool(spec) for spec in self._tools.values()])

    async def _call_tool(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types

        spec = self._tools.get(params.name)
        if spec is None:
            text, failed = json.dumps({"ok": False, "error": f"Unknown tool: {params.name}"}), True
        else:
            reply = await self._run(spec, params.arguments or {})
            text, failed = json.dumps(reply, default=str), reply.get("ok") is not True
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], is_error=failed
        )

    async def _run(self, spec: ToolSpec, arguments: MutableMapping[str, Any]) -> dict[str, Any]:
        missing = [p for p in spec.params if not isinstance(arguments.get(p), str | int)]
        if missing:
            return {"ok": False, "error": f"Missing argument: {', '.join(missing)}"}
        command = spec.command_for(arguments)
        wait = command.get(spec.route.wait_key) if spec.route.wait_key else None
        wait_ms = wait if isinstance(wait, int | float) and wait > 0 else 0
        return await self._backend.call(command, wait_ms=wait_ms)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        manager = self._manager or await self._started()
        if manager is None:
            return web.json_response({"ok": False, "error": MISSING}, status=501)
        return await _AsgiExchange(request).run(manager.handle_request)


def _tool(spec: ToolSpec) -> Any:
    import mcp_types as types

    return types.Tool(
        name=spec.name,
        description=spec.description,
        input_schema=spec.input_schema(),
        annotations=types.ToolAnnotations(read_only_hint=spec.read_only),
    )


class _AsgiExchange:
    """One aiohttp request handed to an ASGI application, its answer streamed back."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._response: web.StreamResponse | None = None
        self._body_sent = False
        self._done = asyncio.Event()

    async def run(self, app: Any) -> web.StreamResponse:
        request = self._request
        self._body = await request.read()  # bounded by the app's client_max_size
        peer = request.transport.get_extra_info("peername") if request.transport else None
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": f"{request.version.major}.{request.version.minor}",
            "method": request.method,
            "scheme": request.scheme,
            "path": request.path,
            "raw_path": request.raw_path.split("?")[0].encode(),
            "query_string": request.query_string.encode(),
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.raw_headers],
            "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
            "server": None,
        }
        try:
            await app(scope, self._receive, self._send)
        finally:
            self._done.set()
        if self._response is None:
            return web.json_response({"ok": False, "error": "No answer"}, status=500)
        return self._response

    async def _receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        # Asked again, an ASGI app is waiting for the client to leave: that is when the answer
        # has gone out (or the app gave up), not before.
        await self._done.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = CIMultiDict(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])
            )
            self._response = web.StreamResponse(status=message["status"], headers=headers)
            await self._response.prepare(self._request)
        elif message["type"] == "http.response.body" and self._response is not None:
            await self._response.write(message.get("body", b""))
            if not message.get("more_body", False):
                await self._response.write_eof()
                self._done.set()
