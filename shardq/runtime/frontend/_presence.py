"""Tells the shards which queues have registered workers, for cron's `skipIfNoWorker`.

The worker registry lives in the front end (`_workers`), the schedules in the shards. Rather
than ask at every slot, the front end sends `{"t": "workers", "queues": [...]}` to every shard
when the set of served queues changes, and to a shard that (re)connects, as `_events` does for
listeners. The registry counts workers per queue, so a registration that changes no queue's
served state costs nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardq.runtime import _messages as msgs

__all__ = ["WorkerPresence"]


class WorkerPresence:
    """The last set of served queues sent to the shards."""

    def __init__(self, shards: int, control: Callable[[int, Mapping[str, Any]], None]) -> None:
        self._shards = shards
        self._control = control
        self._queues: frozenset[str] = frozenset()

    def update(self, queues: frozenset[str]) -> None:
        if queues == self._queues:
            return
        self._queues = queues
        for shard in range(self._shards):
            self.shard_up(shard)

    def shard_up(self, shard: int) -> None:
        """A shard (re)connected, or the set changed: tell it the whole set."""
        self._control(shard, msgs.workers(sorted(self._queues)))
