"""WaitJob across a takeover (several nodes on one database, docs/cluster.md).

A WaitJob parks on the shard that holds its job, on whichever node that is. When the job's
partition passes to another node meanwhile, the old owner's shard drops the job and answers the
parked WaitJob `WAIT_MOVED` at once (`ShardCore.release_moved_waits`). The front end that took
the client's WaitJob does not pass that on: it routes the WaitJob again, with what is left of
its timeout, the way any job id is found (this node's shards, then the other nodes). An owner
that stops with SIGTERM closes its links instead (`Node unavailable: ... closed the link`):
that too is asked again. Between the old owner's drop and the new owner's load no node holds
the job for a moment, so for a grace of two leases after the first such answer a "not found"
or `Node unavailable` is asked again every tenth of a lease instead of answered; past the
grace, or the WaitJob's own timeout, the answer goes to the client. A peer's link is not
re-asked here: its own node does it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final

from shardq.protocol import WAIT_MOVED
from shardq.runtime.frontend._forward import NODE_UNAVAILABLE, PEER
from shardq.runtime.frontend._replies import Client, Reply, StandIn

__all__ = ["RewaitClient", "rewaiting"]

# (client, req, name, cmd, envelope) -> None: `Router.route`.
Route = Callable[..., None]
_WAIT_DEFAULT_S: Final = 30.0  # WaitJob's timeout when it names none (bunqueue's)


class RewaitClient(StandIn):
    """The `Client` a WaitJob is routed for: `WAIT_MOVED` (and, just after it, "not found")
    routes it again; any other reply goes to the real client."""

    __slots__ = ("_cmd", "_deadline", "_grace_s", "_loop", "_moved_until", "_period_s", "_req",
                 "_route")  # fmt: skip

    def __init__(self, client: Client, route: Route, loop: asyncio.AbstractEventLoop,
                 req: object, cmd: dict[str, Any], lease_s: float) -> None:  # fmt: skip
        super().__init__(client)
        self._route, self._loop = route, loop
        self._req, self._cmd = req, cmd
        timeout = cmd.get("timeout")
        wait_s = _WAIT_DEFAULT_S if timeout is None else _seconds(timeout)
        self._deadline = time.monotonic() + wait_s
        self._grace_s, self._period_s = 2 * lease_s, lease_s / 10
        self._moved_until = 0.0

    def send(self, reply: Reply) -> None:
        now = time.monotonic()
        error = str(reply.get("error", "")) if reply.get("ok") is False else ""
        moved = error == WAIT_MOVED
        gone = error.startswith(NODE_UNAVAILABLE)  # the owner stopped (or froze) mid-wait
        if (moved or gone) and not self._moved_until:
            self._moved_until = now + self._grace_s
        again = moved or gone or (bool(self._moved_until) and "not found" in error.lower())
        if again and now < min(self._moved_until, self._deadline):
            if moved:
                self._again()
            else:  # no node holds the job for a moment, or the link is being reopened
                self._loop.call_later(self._period_s, self._again)
            return
        self._client.send(reply)

    def _again(self) -> None:
        left_ms = max(1, int((self._deadline - time.monotonic()) * 1000))
        self._route(self, self._req, "WaitJob", {**self._cmd, "timeout": left_ms})


def _seconds(timeout: object) -> float:
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        return float(timeout) / 1000
    return 0.0


def rewaiting(route: Route, loop: asyncio.AbstractEventLoop, lease_s: float) -> Route:
    """`route`, with each client's WaitJob routed for a `RewaitClient`."""

    def route_wait(client: Client, req: object, name: str, cmd: dict[str, Any],
                   envelope: Any = None) -> None:  # fmt: skip
        if name == "WaitJob" and getattr(client, "no_forward", 0) != PEER:
            client = RewaitClient(client, route, loop, req, dict(cmd), lease_s)
        route(client, req, name, cmd, envelope)

    return route_wait
