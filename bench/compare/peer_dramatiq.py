"""Dramatiq with the Redis broker; `actor.send`, worker `dramatiq <module> --processes 1
--threads <c>`."""

from __future__ import annotations

import importlib
import time
from typing import Any

from bench.compare import peer_tasks

_dramatiq: Any = importlib.import_module("dramatiq")
_redis_broker: Any = importlib.import_module("dramatiq.brokers.redis")
broker: Any = _redis_broker.RedisBroker(url=peer_tasks.redis_url())
_dramatiq.set_broker(broker)
noop: Any = _dramatiq.actor(peer_tasks.noop, actor_name="noop", queue_name=peer_tasks.queue_name())


def reset() -> None:
    broker.client.flushall()


def push_one() -> None:
    noop.send(time.time())


def fill(n: int) -> None:
    for _ in range(n):
        noop.send(time.time())


def push_bulk(size: int) -> None:
    """`group(...).run()`: Dramatiq's call for many jobs, one message per job."""
    _dramatiq.group([noop.message(time.time()) for _ in range(size)]).run()
