"""saq (asyncio, Redis): `Queue.enqueue("noop", ...)`; worker `saq
bench.compare.peer_saq.settings --workers <p>` with `concurrency = <c>` per process.

saq has no enqueue-only bulk call: `Queue.map` enqueues many jobs but then waits for all of
their results, so it measures the drain too. The bulk scenario reports that instead of a number.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from typing import Any

from bench.compare import peer_tasks

_saq: Any = importlib.import_module("saq")
NO_BULK = "no enqueue-only bulk API (Queue.map also waits for every result)"


def _queue() -> Any:
    return _saq.Queue.from_url(peer_tasks.redis_url(), name=peer_tasks.queue_name())


async def noop(ctx: dict[str, Any], *, pushed_at: float) -> None:
    peer_tasks.noop(pushed_at)


settings: dict[str, Any] = {
    "queue": _queue(),
    "functions": [noop],
    "concurrency": peer_tasks.concurrency(),
}


def reset() -> None:
    async def go() -> None:
        queue = _queue()
        await queue.connect()
        await queue.redis.flushall()
        await queue.disconnect()

    asyncio.run(go())


def run_sequential(n: int) -> float:
    """n awaited enqueues one after another; returns the seconds they took."""

    async def go() -> float:
        queue = _queue()
        await queue.connect()
        start = time.perf_counter()
        for _ in range(n):
            await queue.enqueue("noop", pushed_at=time.time())
        took = time.perf_counter() - start
        await queue.disconnect()
        return took

    return asyncio.run(go())


def fill(n: int) -> None:
    """Enqueue n jobs, 100 in flight on one connection pool (not timed)."""

    async def go() -> None:
        queue = _queue()
        await queue.connect()
        for start in range(0, n, 100):
            calls = (queue.enqueue("noop", pushed_at=time.time())
                     for _ in range(min(100, n - start)))  # fmt: skip
            await asyncio.gather(*calls)
        await queue.disconnect()

    asyncio.run(go())


def run_offer(rate: float, count: int) -> None:
    """`count` enqueues at `rate` per second, each stamped with its own push time."""

    async def go() -> None:
        queue = _queue()
        await queue.connect()
        start = time.perf_counter()
        for i in range(count):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await queue.enqueue("noop", pushed_at=time.time())
        await queue.disconnect()

    asyncio.run(go())
