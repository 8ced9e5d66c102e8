"""bunqueue commands the front end answers itself, beyond Hello, Ping and Auth.

- the worker registry (`_workers`): RegisterWorker, Heartbeat, UnregisterWorker,
  ListWorkers, and forgetting a closed connection's workers; the shards hear which queues
  have a worker (`WorkerPresence`, for `skipIfNoWorker`);
- the legacy `Metrics` (`_metrics`): counters taken from the replies of the PUSH, PULL
  and ACK commands on their way back, plus a `Stats` fan-out for the DLQ total; the
  queue-scoped form goes on to the queue's shard;
- `Stats` and `ListQueues`: every shard answers for its own queues, merged here.

With several nodes on one database, `Stats`, `ListQueues`, the legacy `Metrics` and
`ListWorkers` answer for every node (`_aggregate`).

`BunqueueCommands` is handed the `Router`: its `handlers` join the dispatcher's table of
front-end commands, and every shard command passes `before_route` first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shardq.runtime._clock import AnchoredClock
from shardq.runtime.frontend._aggregate import (
    NodeAnswers,
    merge_node_metrics,
    merge_node_queues,
    merge_node_stats,
    merge_node_workers,
)
from shardq.runtime.frontend._forward import FORWARD, PEER
from shardq.runtime.frontend._merge import merge_list_queues, merge_stats
from shardq.runtime.frontend._metrics import (
    COUNTED_COMMANDS,
    Counters,
    memory_usage_mb,
    metrics_reply,
)
from shardq.runtime.frontend._presence import WorkerPresence
from shardq.runtime.frontend._replies import Client, Reply, answer
from shardq.runtime.frontend._router import Router
from shardq.runtime.frontend._workers import WORKER_COMMANDS, WorkerRegistry

__all__ = ["BunqueueCommands", "LocalHandler"]

LocalHandler = Callable[[Any, object, dict[str, Any]], None]


class BunqueueCommands:
    """The worker registry, the Metrics counters, Stats and ListQueues of one front end."""

    def __init__(self, router: Router, rate_window_s: int = 5) -> None:
        self._router = router
        self.workers = WorkerRegistry()
        self.counters = Counters(rate_window_s)
        self._clock = AnchoredClock()  # registry times are wall clock, but never jump
        self._started = time.monotonic()
        self.presence = WorkerPresence(router.shards, router.control_now)  # skipIfNoWorker
        self.nodes = NodeAnswers(router)

    @property
    def handlers(self) -> dict[str, LocalHandler]:
        """The commands answered here, by name."""
        table: dict[str, LocalHandler] = {name: self._worker for name in WORKER_COMMANDS}
        table["Metrics"] = self._metrics
        table["Stats"] = self._stats
        table["ListQueues"] = self._list_queues
        return table

    def before_route(
        self, client: Client, req: object, name: str, cmd: dict[str, Any]
    ) -> Client | None:
        """The client to route shard command `name` for, or None when it was answered here.

        The counters count what this node's clients sent it, forwarded to another node or
        not; a command a peer node sent on (its `NoForward {node}` link) was counted there."""
        if name in COUNTED_COMMANDS and getattr(client, "no_forward", FORWARD) != PEER:
            return self.counters.watch(client, name, cmd)
        return client

    def connection_closed(self, conn: str) -> None:
        """`conn` closed: the workers it registered go with it (docs/protocol.md §2.6, step 2)."""
        self.workers.drop_conn(conn)
        self._served_changed()

    # -- handlers --------------------------------------------------------------------------

    def _worker(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        name = frame["cmd"]
        if name == "ListWorkers":
            self._list_workers(client, req, frame)
            return
        reply = self.workers.handle(name, frame, client.conn, self._clock.now())
        self._served_changed()
        answer(client, req, reply)

    def _list_workers(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        def here(done: Callable[[Reply], None]) -> None:
            reply = self.workers.handle("ListWorkers", frame, client.conn, self._clock.now())
            self._served_changed()  # listing forgets the long-silent workers
            done(reply)

        self.nodes.over_peers(
            client, frame, here, merge_node_workers, lambda r: answer(client, req, r)
        )

    def _served_changed(self) -> None:
        """Tell the shards when a queue gained its first worker or lost its last."""
        if self.workers.served_changed:
            self.workers.served_changed = False
            self.presence.update(self.workers.queues())

    def _metrics(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        if "queue" in frame or "type" in frame:
            # The queue-scoped form: the counts live with the queue, on its shard.
            self._router.route(client, req, "Metrics", frame)
            return

        def here(done: Callable[[Reply], None]) -> None:
            def stats_done(replies: list[Reply]) -> None:
                in_flight = self._router.pending_per_shard()
                done(metrics_reply(self.counters, replies, memory_usage_mb(), in_flight))

            self._router.gather(client, {"cmd": "Stats"}, stats_done)

        self.nodes.over_peers(
            client, frame, here, merge_node_metrics, lambda r: answer(client, req, r)
        )

    def _list_queues(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        self.nodes.over_shards(
            client, frame, merge_list_queues, merge_node_queues, lambda r: answer(client, req, r)
        )

    def _stats(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        uptime = int((time.monotonic() - self._started) * 1000)
        rates = self.counters.rates()
        self.nodes.over_shards(
            client,
            frame,
            lambda rs: merge_stats(rs, uptime, rates),
            merge_node_stats,
            lambda r: answer(client, req, r),
        )
