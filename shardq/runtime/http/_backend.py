"""The HTTP process's connection to the front end: the shardq SDK's `AsyncConnection` over TCP.

Why the SDK over TCP rather than a raw link to the shards or a new internal endpoint: the front
end already validates, routes and fans out every command, keeps the worker registry and the
Metrics counters, and answers a dead shard's requests at once; talking to it as a client means
the REST routes answer exactly what the TCP port answers, with nothing duplicated. The SDK
connection pipelines (one connection carries every concurrent HTTP request), sends `Auth`
first when tokens are configured, and reconnects after a front-end restart. One extra local
TCP round trip per request is nothing next to HTTP's own cost.

No request may hold a slot for ever (issue 26). The front end counts a connection's requests
in flight and stops reading it at `max_in_flight_per_connection`, so requests it never
answers would, on one shared link, end every REST route in 503. So each request waits at
most `http_backend_timeout_ms` (plus its own long-poll wait), and a link that let one go
unanswered is retired: new requests go to a fresh link, and the old one is closed once its
last request is over, which frees whatever the front end still counted for it. Long-polls
have a link of their own, so they can never fill the slots of quick commands.
A `Backend(spec, internal=True)` authenticates with the supervisor's internal token, which
marks its links internal (`AuthCheck` and `WebhookSync` are accepted only there); the one that
carries clients' REST and /ws commands never does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

import structlog

from shardq.client import AsyncConnection, CommandTimeout
from shardq.errors import ShardqError
from shardq.runtime._spec import ChildSpec
from shardq.runtime._tls import loopback_client_context

__all__ = ["Backend", "Reply"]

Reply = dict[str, Any]
log = structlog.get_logger()

# The default wait for a reply (`http_backend_timeout_ms`'s default); a command's own wait
# (PULL's or WaitJob's `timeout`) comes on top.
TIMEOUT_S: Final = 10.0
CONNECT_TIMEOUT_S: Final = 2.0
_MAX_SAFE: Final = 2**53  # beyond it a float's whole value is not the number that was meant
_WILDCARDS: Final = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def frontend_url(spec: ChildSpec) -> str:
    """The front end's TCP address as a client on this machine reaches it."""
    host = _WILDCARDS.get(spec.tcp.host, spec.tcp.host)
    scheme = "tls" if spec.tcp.tls_cert_file else "tcp"
    return (
        f"{scheme}://[{host}]:{spec.tcp.tcp_port}"
        if ":" in host
        else f"{scheme}://{host}:{spec.tcp.tcp_port}"
    )


class _Link:
    __slots__ = ("conn", "in_flight", "retired")

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.in_flight = 0
        self.retired = False


class Backend:
    """Sends commands to the front end; a failure to reach it becomes an error reply."""

    def __init__(self, spec: ChildSpec, *, internal: bool = False) -> None:
        """`internal`: authenticate with the supervisor's per-run `internal_token`, which marks
        these connections as the HTTP process's internal link (the only one served WebhookSync
        and AuthCheck). Never for the links that carry REST and /ws commands: a client's
        command must never ride an internal link."""
        self._spec = spec
        self._internal = internal
        # A command's own wait (PULL's or WaitJob's `timeout`) comes on top of this.
        self.timeout_s = spec.http.http_backend_timeout_ms / 1000
        self._quick = self._open()
        self._slow = self._open()  # long-polls
        self._closing: set[asyncio.Task[None]] = set()
        self.retired = 0  # links replaced after a request went unanswered

    def _open(self) -> _Link:
        spec = self._spec
        token = spec.tcp.auth_tokens[0] if spec.tcp.auth_tokens else None
        if self._internal and spec.internal_token:
            token = spec.internal_token
        tls = loopback_client_context(spec.tcp.tls_cert_file) if spec.tcp.tls_cert_file else None
        conn = AsyncConnection(
            frontend_url(spec),
            token=token,
            timeout=self.timeout_s,
            connect_timeout=CONNECT_TIMEOUT_S,
            tls_context=tls,
            # Its own front end, over TCP: the client's SHARDQ_* settings are not for it.
            zmq_server_key="",
            tls_ca_file="",
            # Everything the HTTP port does goes through the front end, pushes included (its
            # counters and job cache see them; docs/runtime.md, "The direct path").
            direct=False,
        )
        return _Link(conn)

    @property
    def live(self) -> bool:
        return self._quick.conn.live

    async def call(self, command: Mapping[str, Any], *, wait_ms: float = 0) -> Reply:
        """The front end's reply to `command`; `{ok: false, error: "Server unavailable: ..."}`
        when it cannot be reached (it is starting, restarting or stopping)."""
        return (await self.call_many([command], wait_ms=wait_ms))[0]

    async def call_many(
        self, commands: Sequence[Mapping[str, Any]], *, wait_ms: float = 0
    ) -> list[Reply]:
        """Pipelined replies in order, each an error reply if the front end cannot answer."""
        link = self._slow if wait_ms > 0 else self._quick
        link.in_flight += 1
        try:
            replies = await link.conn.call_many(commands, wait=wait_ms / 1000, check=False)
        except ShardqError as e:
            if isinstance(e, CommandTimeout):
                self._retire(link)
            error = {"ok": False, "error": f"Server unavailable: {e}"}
            return [dict(error) for _ in commands]
        finally:
            link.in_flight -= 1
            if link.retired and link.in_flight == 0:
                self._close_later(link)
        for reply in replies:
            reply.pop("reqId", None)  # the TCP envelope's, not part of the answer
        return [_whole_numbers(reply) for reply in replies]

    def _retire(self, link: _Link) -> None:
        """Send nothing more on `link`: the front end may hold its slot for good."""
        if link.retired:
            return
        link.retired = True
        self.retired += 1
        if link is self._quick:
            self._quick = self._open()
        elif link is self._slow:
            self._slow = self._open()
        log.warning("http backend link retired", reason="a request went unanswered")

    def _close_later(self, link: _Link) -> None:
        task = asyncio.get_running_loop().create_task(link.conn.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        for link in (self._quick, self._slow):
            await link.conn.close()
        for task in list(self._closing):
            with contextlib.suppress(Exception):
                await task


def _whole_numbers(value: Any) -> Any:
    """Floats that hold whole numbers as ints again: the TCP port sends large ones (epoch-ms
    times) as floats for bunqueue's JS clients (docs/protocol.md §21.5), and JSON should read
    `1796171053576`, as bunqueue's own HTTP answers do, not `1796171053576.0`."""
    kind = type(value)
    if kind is float:
        return int(value) if value.is_integer() and abs(value) <= _MAX_SAFE else value
    if kind is dict:
        return {k: _whole_numbers(v) for k, v in value.items()}
    if kind is list:
        return [_whole_numbers(v) for v in value]
    return value
