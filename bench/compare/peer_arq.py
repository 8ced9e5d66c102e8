"""arq (asyncio, Redis): `ArqRedis.enqueue_job`; worker `arq bench.compare.peer_arq.WorkerSettings`
with `max_jobs = <c>` and its other defaults (poll_delay 0.5 s, results kept 1 h)."""

from __future__ import annotations

import asyncio
import importlib
import time
from typing import Any, ClassVar

from bench.compare import peer_tasks

_arq: Any = importlib.import_module("arq")
_connections: Any = importlib.import_module("arq.connections")
redis_settings: Any = _connections.RedisSettings.from_dsn(peer_tasks.redis_url())


async def noop(ctx: dict[str, Any], pushed_at: float) -> None:
    peer_tasks.noop(pushed_at)


class WorkerSettings:
    functions: ClassVar[list[Any]] = [noop]
    redis_settings = redis_settings
    queue_name = peer_tasks.queue_name()
    max_jobs = peer_tasks.concurrency()


async def _pool() -> Any:
    return await _arq.create_pool(redis_settings, default_queue_name=peer_tasks.queue_name())


def reset() -> None:
    async def go() -> None:
        pool = await _pool()
        await pool.flushall()
        await pool.aclose()

    asyncio.run(go())


async def _push_window(pool: Any, n: int, window: int) -> None:
    sem = asyncio.Semaphore(window)

    async def one() -> None:
        async with sem:
            await pool.enqueue_job("noop", time.time())

    await asyncio.gather(*(one() for _ in range(n)))


def run_sequential(n: int) -> float:
    """n awaited enqueues one after another; returns the seconds they took."""

    async def go() -> float:
        pool = await _pool()
        start = time.perf_counter()
        for _ in range(n):
            await pool.enqueue_job("noop", time.time())
        took = time.perf_counter() - start
        await pool.aclose()
        return took

    return asyncio.run(go())


def run_pipelined(n: int, window: int) -> float:
    """n enqueues with at most `window` in flight on one pool; returns the seconds they took."""

    async def go() -> float:
        pool = await _pool()
        start = time.perf_counter()
        await _push_window(pool, n, window)
        took = time.perf_counter() - start
        await pool.aclose()
        return took

    return asyncio.run(go())


def fill(n: int) -> None:
    run_pipelined(n, 100)


def run_offer(rate: float, count: int) -> None:
    """`count` enqueues at `rate` per second, each stamped with its own push time."""

    async def go() -> None:
        pool = await _pool()
        start = time.perf_counter()
        for i in range(count):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await pool.enqueue_job("noop", time.time())
        await pool.aclose()

    asyncio.run(go())
