"""taskiq with taskiq-redis's `RedisStreamBroker` (the broker its documentation recommends:
messages stay in a Redis stream until the worker acknowledges them); `noop.kiq(...)`; worker
`taskiq worker bench.compare.peer_taskiq:broker --workers <p> --max-async-tasks <c>`.

taskiq has no bulk kick: the bulk scenario reports that instead of a number.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from typing import Any

from bench.compare import peer_tasks

_taskiq_redis: Any = importlib.import_module("taskiq_redis")
_redis: Any = importlib.import_module("redis.asyncio")
NO_BULK = "no bulk API (one kiq() per job)"

broker: Any = _taskiq_redis.RedisStreamBroker(
    url=peer_tasks.redis_url(), queue_name=peer_tasks.queue_name()
)


async def _noop(pushed_at: float) -> None:
    peer_tasks.noop(pushed_at)


noop: Any = broker.task(task_name="noop")(_noop)


def reset() -> None:
    async def go() -> None:
        client = _redis.Redis.from_url(peer_tasks.redis_url())
        await client.flushall()
        await client.aclose()

    asyncio.run(go())


async def _started() -> None:
    # The producer's startup creates the stream's consumer group at "$" before the first
    # message, so a worker started later still reads the jobs pushed before it.
    await broker.startup()


def run_sequential(n: int) -> float:
    """n awaited kicks one after another; returns the seconds they took."""

    async def go() -> float:
        await _started()
        start = time.perf_counter()
        for _ in range(n):
            await noop.kiq(time.time())
        took = time.perf_counter() - start
        await broker.shutdown()
        return took

    return asyncio.run(go())


def fill(n: int) -> None:
    """Kick n jobs, 100 in flight (not timed)."""

    async def go() -> None:
        await _started()
        for start in range(0, n, 100):
            await asyncio.gather(*(noop.kiq(time.time()) for _ in range(min(100, n - start))))
        await broker.shutdown()

    asyncio.run(go())


def run_offer(rate: float, count: int) -> None:
    """`count` kicks at `rate` per second, each stamped with its own push time."""

    async def go() -> None:
        await _started()
        start = time.perf_counter()
        for i in range(count):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await noop.kiq(time.time())
        await broker.shutdown()

    asyncio.run(go())
