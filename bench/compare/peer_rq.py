"""RQ on Redis, its standard `Queue.enqueue` and forking workers (`rq worker-pool -n <c>`)."""

from __future__ import annotations

import importlib
import time
from typing import Any

from bench.compare import peer_tasks

_redis: Any = importlib.import_module("redis")
_rq: Any = importlib.import_module("rq")
conn: Any = _redis.Redis.from_url(peer_tasks.redis_url())
queue: Any = _rq.Queue(peer_tasks.queue_name(), connection=conn)
TASK = "bench.compare.peer_tasks.noop"


def reset() -> None:
    conn.flushall()


def push_one() -> None:
    queue.enqueue(TASK, time.time())


def push_bulk(size: int) -> None:
    """`Queue.enqueue_many`: one Redis pipeline for `size` jobs."""
    queue.enqueue_many([_rq.Queue.prepare_data(TASK, args=(time.time(),)) for _ in range(size)])


def fill(n: int) -> None:
    for start in range(0, n, 1000):
        push_bulk(min(1000, n - start))
