"""bunqueue's monitoring commands on the TCP and ZeroMQ ports (docs/protocol.md §21.6).

`Prometheus`, `StorageStatus` and the three `Dashboard*` commands answer what the HTTP
process's `/prometheus`, `/health` storage facts and `/dashboard` routes answer, built by the
same code through a `LocalBackend`, wrapped in `data` as bunqueue wraps them. `CompactMemory`
collects garbage and gives freed heap back in every shard (`release_memory`) and here.

They run as tasks on the front end's loop: the answer is sent when the shards have answered
the commands each one is built from.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from shardq.protocol import INTERNAL_SERVER_ERROR, DecodedFrame, error_reply
from shardq.runtime._spec import ChildSpec
from shardq.runtime.frontend._replies import Client, answer
from shardq.runtime.frontend._router import Router

__all__ = ["MONITORING_COMMANDS", "MonitoringCommands"]

Reply = dict[str, Any]
_log = structlog.get_logger()

MONITORING_COMMANDS = frozenset(
    {
        "Prometheus",
        "StorageStatus",
        "CompactMemory",
        "DashboardOverview",
        "DashboardQueues",
        "DashboardQueue",
    }
)


def _text(value: object) -> str | None:
    return None if value is None or isinstance(value, bool) else str(value)


# The dispatcher's `handle`: the commands a view is built from take a client's whole path.
Handle = Callable[[Client, DecodedFrame], None]


class MonitoringCommands:
    """The monitoring commands' handlers (`handlers`): `CompactMemory` over the router, the
    others built by the HTTP process's views from commands fed to `handle`."""

    def __init__(self, router: Router, handle: Handle, spec: ChildSpec) -> None:
        self._router = router
        self._handle = handle
        self._spec = spec
        self._views: Any = None  # (Monitor, Overview), made on first use
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def handlers(self) -> dict[str, Callable[[Any, object, dict[str, Any]], None]]:
        table: dict[str, Callable[[Any, object, dict[str, Any]], None]] = {
            name: self._run for name in MONITORING_COMMANDS
        }
        table["CompactMemory"] = self._compact
        return table

    def _compact(self, client: Any, req: object, frame: dict[str, Any]) -> None:
        gc.collect()

        def done(replies: list[Reply]) -> None:
            failed = next((r for r in replies if not r.get("ok")), None)
            answer(client, req, failed or {"ok": True})

        self._router.gather(client, {"cmd": "CompactMemory"}, done)

    def _run(self, client: Any, req: object, frame: dict[str, Any]) -> None:
        task = asyncio.ensure_future(self._answer(client, req, frame))
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, client: Any, req: object, frame: dict[str, Any]) -> None:
        try:
            reply = await self._build(frame)
        except Exception:
            _log.exception("monitoring command failed", command=frame.get("cmd"))
            reply = error_reply(INTERNAL_SERVER_ERROR)
        answer(client, req, reply)

    def _build(self, frame: dict[str, Any]) -> Coroutine[Any, Any, Reply]:
        if self._views is None:
            # Deferred: these modules belong to the HTTP process (see _local_backend).
            from shardq.runtime.frontend._local_backend import LocalBackend
            from shardq.runtime.http._monitor import Monitor
            from shardq.runtime.http._overview import Overview

            backend = LocalBackend(self._handle)
            monitor = Monitor(self._spec, backend)
            self._views = (monitor, Overview(backend, monitor))
        name = frame["cmd"]
        builders = {
            "Prometheus": self._prometheus,
            "StorageStatus": self._storage,
            "DashboardOverview": self._overview,
            "DashboardQueues": self._queues,
            "DashboardQueue": self._queue,
        }
        return builders[name](frame)

    async def _prometheus(self, frame: dict[str, Any]) -> Reply:
        text = await self._views[0].prometheus()
        return {"ok": True, "data": {"metrics": text.decode()}}

    async def _storage(self, frame: dict[str, Any]) -> Reply:
        snap = await self._views[0].snapshot(local=True)  # this node's writer
        facts = snap.storage
        return {
            "ok": True,
            "data": {"diskFull": facts.disk_full, "error": facts.error, "since": facts.since},
        }

    async def _overview(self, frame: dict[str, Any]) -> Reply:
        body = await self._views[1].overview()
        if body.pop("ok") is not True:
            return error_reply("Shard unavailable: the server did not answer Stats")
        return {"ok": True, "data": body}

    async def _queues(self, frame: dict[str, Any]) -> Reply:
        body = await self._views[1].queues(_text(frame.get("limit")), _text(frame.get("offset")))
        return _wrapped(body)

    async def _queue(self, frame: dict[str, Any]) -> Reply:
        queue = frame.get("queue")
        if not isinstance(queue, str) or not queue:
            return error_reply("Queue name is required")
        body = await self._views[1].queue(queue, frame.get("includeJobs") is True)
        return _wrapped(body)


def _wrapped(body: Reply) -> Reply:
    """An HTTP body `{ok, ...}` as bunqueue's TCP reply `{ok, data: {...}}`."""
    if body.get("ok") is not True:
        return body
    body.pop("ok")
    return {"ok": True, "data": body}
