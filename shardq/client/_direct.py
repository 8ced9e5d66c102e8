"""The direct path: single pushes straight to the shard that owns their queue.

A server started with `direct_shards` announces, in its Hello reply, its shard count and one
TCP port per shard (`shardq.protocol._direct`). A connection (`Connection`, `AsyncConnection`)
asks as it connects, and from then on sends each single PUSH (no flow fields) to
`shard_of(queue, shards)`'s port on the server's host: one process hop instead of two
(docs/runtime.md, "The direct path"). Everything else, and every PUSH while the direct path is
off, goes through the front end as before.

Falling back: a shard that cannot be reached (a restarted shard listens on a new port), a
connection that broke before the request was written, and a refusal (`DIRECT_REFUSED`: the
shard does not serve it, nothing was applied) all send the push through the front end, and the
direct path rests for `REFRESH_S` before the connection asks Hello again (`RECHECK_S` after a
Hello that offered no ports); each failure in a row doubles the rest, up to `RECHECK_S`. A
port that could not be connected to (a firewall, a proxy in front of the server) is not tried
again by this connection: pushes for its shard go through the front end until a Hello (asked
every `RECHECK_S` meanwhile) offers that shard another port (a restart). A direct connection
the shard closed while it waited for nothing (`tcp_idle_close_ms`) is opened again at once;
whether the shard closed it is asked of the socket before a push (a `poll` with no wait),
except on a connection that wrote a push less than `FRESH_S` ago (a caller pushing back to
back), which the idle close cannot have reached yet (`SyncTcpTransport.fresh`). A
connection lost after the push was written is raised, as through the front end
(`ConnectionLost(sent=True)`), and so is a reply that does not come in time
(`CommandTimeout`): the push may have been applied, so it is not silently sent twice.

A shard that stops (a restart, a recycle) ends its direct connections with a goodbye frame
(`protocol._direct.direct_goodbye`) once it has answered every push it took: a push with no
reply by then was not taken, so it goes through the front end (`ConnectionLost(sent=False)`
from the transport), and the direct path rests as after any failure: the next Hello names the
new process's port.

The asyncio connections (`AsyncDirectRoutes`) are in `shardq.client._async_direct`: a blocking
client does not import asyncio.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from shardq.client._errors import CommandTimeout, ConnectionLost
from shardq.client._sync_transport import SyncTcpTransport, wait_replies
from shardq.client._url import ClientSecurity, Endpoint
from shardq.protocol._direct import DIRECT_REFUSED, HELLO_DIRECT, HELLO_SHARDS, names_flow, shard_of

__all__ = [
    "HELLO",
    "PROBE",
    "REFRESH_S",
    "DirectLost",
    "DirectRoutes",
    "Routes",
    "direct_queue",
    "refused",
]

Reply = dict[str, Any]

HELLO: Final[Mapping[str, Any]] = {"cmd": "Hello", "protocolVersion": 3}
REFRESH_S: Final = 1.0
"""After a failure of the direct path, pushes go through the front end this long before the
connection asks the server for the shards' ports again."""
# A server whose Hello offers no ports (direct_shards off, a shard down, bunqueue) is asked
# again this much later: the question costs a round trip through the front end.
RECHECK_S: Final = 30.0
# Sent once on each new direct connection, before any push: a shard at its connection cap
# accepts and closes at once, and a push written then could not be told apart from one the
# shard took. Any reply (the port refuses Ping) proves the connection is served.
PROBE: Final[Mapping[str, Any]] = {"cmd": "Ping"}


class DirectLost(ConnectionLost):
    """A shard's direct connection broke after the push was written (it may have been
    applied); the connection to the front end is unaffected."""


def direct_queue(commands: Sequence[Mapping[str, Any]]) -> str | None:
    """The queue of a lone PUSH the direct path may carry, else None."""
    if len(commands) != 1:
        return None
    cmd = commands[0]
    queue = cmd.get("queue")
    if cmd.get("cmd") != "PUSH" or type(queue) is not str:
        return None
    if names_flow(cmd):  # the front end checks a flow's parents
        return None
    return queue


def _ports(hello: Reply) -> tuple[int, list[int]] | None:
    shards, ports = hello.get(HELLO_SHARDS), hello.get(HELLO_DIRECT)
    if type(shards) is not int or shards < 1 or not isinstance(ports, list):
        return None
    if len(ports) != shards or not all(type(p) is int and 0 < p < 65536 for p in ports):
        return None
    return shards, ports


def refused(reply: Reply) -> bool:
    error = reply.get("error")
    return reply.get("ok") is False and isinstance(error, str) and error.startswith(DIRECT_REFUSED)


class Routes:
    """What both kinds share: the ports, which shard, and when to ask again."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float) -> None:
        self._endpoint = endpoint
        self._connect_timeout = connect_timeout
        self.shards = 0
        self._addresses: list[Endpoint] = []
        self._ask_at = 0.0  # monotonic: when to (re)learn the ports; 0 = at the next push
        self._failures = 0  # in a row, since the last push that went direct
        self._unreachable: set[int] = set()  # ports a connect to failed
        self._recheck_at = 0.0  # monotonic: when a Hello may bring others for them
        self.used = 0  # pushes answered on the direct path (for tests and benchmarks)

    @property
    def ready(self) -> bool:
        """Whether the ports are known (pushes may go direct now)."""
        return bool(self._addresses)

    def due(self) -> bool:
        """Whether the ports should be asked for (with `HELLO`) before this push."""
        if self._addresses:
            return False
        now = time.monotonic()
        if now < self._ask_at:
            return False
        self._ask_at = now + REFRESH_S  # a Hello that fails is not sent again at every push
        return True

    def learn(self, hello: Reply) -> None:
        """Take the ports from a Hello reply; a server without them is asked again later."""
        got = _ports(hello)
        self._ask_at = time.monotonic() + (REFRESH_S if got is not None else RECHECK_S)
        if got is None:
            self.shards, self._addresses = 0, []
            return
        self.shards = got[0]
        self._unreachable &= set(got[1])  # only the ports still announced
        self._recheck_at = time.monotonic() + RECHECK_S
        # Plain TCP on the server's host, whichever transport the connection itself uses.
        self._addresses = [
            dataclasses.replace(self._endpoint, scheme="tcp", port=p) for p in got[1]
        ]

    def _rest(self) -> None:
        """The direct path failed: through the front end for a while, then ask again."""
        self._addresses = []
        self._failures += 1
        rest = min(REFRESH_S * 2 ** min(self._failures - 1, 16), RECHECK_S)
        self._ask_at = time.monotonic() + rest

    def _unreached(self, address: Endpoint) -> None:
        """No connection to `address` could be made: not tried again (a restarted shard gets a
        new port, which a later Hello brings)."""
        self._unreachable.add(address.port)
        self._rest()

    def _answered(self) -> None:
        self.used += 1
        self._failures = 0

    def _address(self, queue: str) -> tuple[int, Endpoint] | None:
        if not self._addresses:
            return None
        shard = shard_of(queue, self.shards)
        address = self._addresses[shard]
        if address.port in self._unreachable:
            if time.monotonic() >= self._recheck_at:
                self._addresses = []  # the next push asks Hello again (`due`)
                self._ask_at = 0.0
            return None
        return shard, address


class DirectRoutes(Routes):
    """The blocking connections to the shards' direct ports, opened on first use."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float) -> None:
        super().__init__(endpoint, connect_timeout)
        self._open: dict[int, SyncTcpTransport] = {}
        self._lock = threading.Lock()

    def call(self, queue: str, command: Mapping[str, Any], timeout: float) -> Reply | None:
        """Push on the direct path; None when it goes through the front end instead.

        Raises `ConnectionLost(sent=True)` and `CommandTimeout` as `wait_replies` does, once
        the push was written.
        """
        found = self._address(queue)
        if found is None:
            return None
        transport = self._transport(*found)
        if transport is None:
            return None
        try:
            reply = wait_replies(transport, [command], timeout)[0]
        except ConnectionLost as e:
            self._drop(found[0], transport)
            if e.sent:
                raise DirectLost(str(e), sent=True) from e
            return None
        if refused(reply):
            self._rest()
            return None
        self._answered()
        return reply

    def _transport(self, shard: int, address: Endpoint) -> SyncTcpTransport | None:
        with self._lock:
            transport = self._open.get(shard)
            if transport is not None and (transport.fresh or transport.alive):
                return transport
            if transport is not None:  # closed by the shard: idle, restarted or gone
                transport.close()
                del self._open[shard]
                if transport.ended:  # a stopping shard: its port is going away
                    self._rest()
                    return None
            try:  # a restarted shard's old port refuses this at once
                transport = SyncTcpTransport(address, self._connect_timeout, ClientSecurity())
            except ConnectionLost:
                self._unreached(address)
                return None
            try:
                wait_replies(transport, [PROBE], self._connect_timeout)
            except (ConnectionLost, CommandTimeout):
                transport.close()
                self._rest()
                return None
            self._open[shard] = transport
            return transport

    def _drop(self, shard: int, transport: SyncTcpTransport) -> None:
        with self._lock:
            if self._open.get(shard) is transport:
                del self._open[shard]
            self._rest()
        transport.close()

    def close(self) -> None:
        with self._lock:
            open_, self._open = self._open, {}
            self._addresses = []
        for transport in open_.values():
            transport.close()
