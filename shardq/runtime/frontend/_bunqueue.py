"""bunqueue commands the front end answers itself, beyond Hello, Ping, Auth, Stats, ListQueues.

- the worker registry (`_workers`): RegisterWorker, Heartbeat, UnregisterWorker,
  ListWorkers, and forgetting a closed connection's workers;
- the legacy `Metrics` (`_metrics`): counters taken from the replies of the PUSH, PULL
  and ACK commands on their way back, plus a `Stats` fan-out for the DLQ total; the
  queue-scoped form goes on to the queue's shard;

`BunqueueCommands` is plugged into the `Dispatcher`: its `handlers` join the front end's local
commands and every shard command passes `before_route` first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from shardq.runtime._clock import AnchoredClock
from shardq.runtime.frontend._metrics import (
    COUNTED_COMMANDS,
    Counters,
    memory_usage_mb,
    metrics_reply,
)
from shardq.runtime.frontend._presence import WorkerPresence
from shardq.runtime.frontend._workers import WORKER_COMMANDS, WorkerRegistry

__all__ = ["BunqueueCommands"]

Reply = dict[str, Any]


class _Client(Protocol):
    conn: str
    authenticated: bool

    def send(self, reply: Reply) -> None: ...

    def drop(self, reason: str) -> None: ...


Answer = Callable[[Any, object, Reply], None]
GatherAll = Callable[[Any, dict[str, Any], Callable[[list[Reply]], None]], None]
Route = Callable[[Any, object, str, dict[str, Any]], None]
LocalHandler = Callable[[Any, object, dict[str, Any]], None]


class BunqueueCommands:
    """The worker registry, the Metrics counters and the flow refusals of one front end.

    `answer(client, req, reply)` sends a reply; `gather_all(client, frame, done)` asks every
    shard and calls `done` with their replies in shard order (both the dispatcher's).
    """

    def __init__(
        self,
        answer: Answer,
        gather_all: GatherAll,
        rate_window_s: int = 5,
        in_flight: Callable[[], list[int]] | None = None,
        route: Route | None = None,
    ) -> None:
        self._answer = answer
        self._route = route
        self._gather_all = gather_all
        self._in_flight = in_flight or (lambda: [])
        self.workers = WorkerRegistry()
        self.counters = Counters(rate_window_s)
        self._clock = AnchoredClock()  # registry times are wall clock, but never jump
        self.presence: WorkerPresence | None = None  # set by the dispatcher

    @property
    def handlers(self) -> dict[str, LocalHandler]:
        """The commands answered here, by name."""
        table: dict[str, LocalHandler] = {name: self._worker for name in WORKER_COMMANDS}
        table["Metrics"] = self._metrics
        return table

    def before_route(
        self, client: _Client, req: object, name: str, cmd: dict[str, Any]
    ) -> _Client | None:
        """The client to route shard command `name` for, or None when it was answered here."""
        if name in COUNTED_COMMANDS:
            return self.counters.watch(client, name, cmd)
        return client

    def connection_closed(self, conn: str) -> None:
        """`conn` closed: the workers it registered go with it (docs/protocol.md §2.6, step 2)."""
        self.workers.drop_conn(conn)
        self._served_changed()

    # -- handlers --------------------------------------------------------------------------

    def _worker(self, client: _Client, req: object, frame: dict[str, Any]) -> None:
        name = frame["cmd"]
        reply = self.workers.handle(name, frame, client.conn, self._clock.now())
        self._served_changed()
        self._answer(client, req, reply)

    def _served_changed(self) -> None:
        """Tell the shards when a queue gained its first worker or lost its last."""
        if self.workers.served_changed and self.presence is not None:
            self.workers.served_changed = False
            self.presence.update(self.workers.queues())

    def _metrics(self, client: _Client, req: object, frame: dict[str, Any]) -> None:
        if self._route is not None and ("queue" in frame or "type" in frame):
            # The queue-scoped form: the counts live with the queue, on its shard.
            frame["_conn"] = client.conn
            self._route(client, req, "Metrics", frame)
            return
        stats = {"cmd": "Stats"}

        def done(replies: list[Reply]) -> None:
            reply = metrics_reply(self.counters, replies, memory_usage_mb(), self._in_flight())
            self._answer(client, req, reply)

        self._gather_all(client, stats, done)
