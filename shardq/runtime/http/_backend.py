"""The HTTP process's connection to the front end: the shardq SDK's `AsyncConnection` over TCP.

Why the SDK over TCP rather than a raw link to the shards or a new internal endpoint: the front
end already validates, routes and fans out every command, keeps the worker registry and the
Metrics counters, and answers a dead shard's requests at once; talking to it as a client means
the REST routes answer exactly what the TCP port answers, with nothing duplicated. The SDK
connection pipelines (one connection carries every concurrent HTTP request), sends `Auth`
first when tokens are configured, and reconnects after a front-end restart. One extra local
TCP round trip per request is nothing next to HTTP's own cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from shardq.client import AsyncConnection
from shardq.errors import ShardqError
from shardq.runtime._spec import ChildSpec
from shardq.runtime._tls import loopback_client_context

__all__ = ["Backend", "Reply"]

Reply = dict[str, Any]
# A command's own wait (PULL's or WaitJob's `timeout`) comes on top of this.
TIMEOUT_S: Final = 10.0
CONNECT_TIMEOUT_S: Final = 2.0
_MAX_SAFE: Final = 2**53  # beyond it a float's whole value is not the number that was meant
_WILDCARDS: Final = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def frontend_url(spec: ChildSpec) -> str:
    """The front end's TCP address as a client on this machine reaches it."""
    host = _WILDCARDS.get(spec.host, spec.host)
    scheme = "tls" if spec.tls_cert_file else "tcp"
    return (
        f"{scheme}://[{host}]:{spec.tcp_port}"
        if ":" in host
        else f"{scheme}://{host}:{spec.tcp_port}"
    )


class Backend:
    """Sends commands to the front end; a failure to reach it becomes an error reply."""

    def __init__(self, spec: ChildSpec, *, internal: bool = False) -> None:
        """`internal`: authenticate with the supervisor's per-run key, which marks this
        connection as the HTTP process's internal link (the only one served WebhookSync).
        Never for the connection that carries REST and /ws commands: a client's command must
        never ride an internal link."""
        token = spec.auth_tokens[0] if spec.auth_tokens else None
        if internal and spec.internal_key:
            token = spec.internal_key
        tls = loopback_client_context(spec.tls_cert_file) if spec.tls_cert_file else None
        self._conn = AsyncConnection(
            frontend_url(spec),
            token=token,
            timeout=TIMEOUT_S,
            connect_timeout=CONNECT_TIMEOUT_S,
            tls_context=tls,
        )

    @property
    def live(self) -> bool:
        return self._conn.live

    async def call(self, command: Mapping[str, Any], *, wait_ms: float = 0) -> Reply:
        """The front end's reply to `command`; `{ok: false, error: "Server unavailable: ..."}`
        when it cannot be reached (it is starting, restarting or stopping)."""
        return (await self.call_many([command], wait_ms=wait_ms))[0]

    async def call_many(
        self, commands: Sequence[Mapping[str, Any]], *, wait_ms: float = 0
    ) -> list[Reply]:
        """Pipelined replies in order, each an error reply if the front end cannot answer."""
        try:
            replies = await self._conn.call_many(commands, wait=wait_ms / 1000, check=False)
        except ShardqError as e:
            error = {"ok": False, "error": f"Server unavailable: {e}"}
            return [dict(error) for _ in commands]
        for reply in replies:
            reply.pop("reqId", None)  # the TCP envelope's, not part of the answer
        return [_whole_numbers(reply) for reply in replies]

    async def close(self) -> None:
        await self._conn.close()


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
