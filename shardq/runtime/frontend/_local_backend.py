"""The HTTP process's `Backend`, served inside the front end: commands go to its dispatcher's
`handle`.

The monitoring commands (`Prometheus`, `DashboardOverview`, ...) answer what the HTTP routes
answer, built by the same code (`shardq.runtime.http._monitor`, `_overview`). That code asks
its backend for `Stats`, `ListQueues` and the like; here those commands take the front end's
own path (validation, routing, fan-out) without a socket. Imported on first use only: it pulls
in the HTTP process's modules, which a front end that is never asked for them does not need.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from shardq.protocol import DecodedFrame
from shardq.runtime.frontend._replies import Client
from shardq.runtime.http._backend import TIMEOUT_S, Backend, Reply

__all__ = ["LocalBackend"]

_CONN: Final = "frontend-monitor"


class _Inbox:
    """The dispatcher's `Client` for the monitor's own commands: replies resolve futures."""

    conn = _CONN
    authenticated = True

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[Reply]] = {}

    def send(self, reply: Reply) -> None:
        future = self.waiting.pop(str(reply.pop("reqId", "")), None)
        if future is not None and not future.done():
            future.set_result(reply)

    def drop(self, reason: str) -> None:  # never asked: the monitor sends well-formed frames
        pass


class LocalBackend(Backend):
    def __init__(self, handle: Callable[[Client, DecodedFrame], None]) -> None:
        self._handle = handle  # no connection: see the module doc
        self._inbox = _Inbox()
        self._ids = itertools.count(1)

    @property
    def live(self) -> bool:
        return False  # not a TCP client: it takes no connection of the port's count

    async def call_many(
        self, commands: Sequence[Mapping[str, Any]], *, wait_ms: float = 0
    ) -> list[Reply]:
        loop = asyncio.get_running_loop()
        futures, reqs = [], []
        for command in commands:
            req = str(next(self._ids))
            reqs.append(req)
            future: asyncio.Future[Reply] = loop.create_future()
            self._inbox.waiting[req] = future
            futures.append(future)
            self._handle(self._inbox, {**command, "reqId": req})
        try:
            return list(
                await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT_S + wait_ms / 1000)
            )
        except TimeoutError:
            for req in reqs:
                self._inbox.waiting.pop(req, None)
            error = {"ok": False, "error": "Server unavailable: no answer from the shards"}
            return [dict(error) for _ in commands]

    async def close(self) -> None:
        self._inbox.waiting.clear()
