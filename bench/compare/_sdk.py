"""shardq's own client (`shardq.client.Queue`, `AsyncQueue`, `Worker`) in the comparison.

Used with its defaults, which `worker_label()` spells out in the report (the prefetch buffer,
ACK batching, a 2 s long-poll). Pipelined pushes use `AsyncQueue` with 100 `add` calls in
flight on its one connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.compare._model import Scenario, Settings
from bench.compare._record import record

__all__ = ["sdk_available", "sdk_offer", "sdk_runner", "start_sdk_workers", "worker_label"]

Runner = Callable[[int, Sequence[str], Scenario, Settings], float]


def sdk_available() -> bool:
    """True when `shardq.client` has the SDK (`Queue`, `AsyncQueue`, `Worker`)."""
    import shardq.client as client

    return all(hasattr(client, name) for name in ("Queue", "AsyncQueue", "Worker"))


def worker_label() -> str:
    """The drain and latency rows' client: the `Worker` and the settings it runs with."""
    from shardq.client import WorkerConfig

    cfg = WorkerConfig()
    acks = (
        f"ACKB <= {cfg.ack_batch_size} or {cfg.ack_flush_interval * 1000:g} ms"
        if cfg.ack_batch
        else "ACK per job"
    )
    return f"shardq-sdk Worker (prefetch {cfg.prefetch}, {acks})"


def _url(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def _options(durable: bool) -> dict[str, Any] | None:
    return {"durable": True} if durable else None


def sdk_single(port: int, queues: Sequence[str], n: int, durable: bool) -> float:
    from shardq.client import Queue

    with Queue(queues[0], _url(port)) as q:
        options = _options(durable)
        start = time.perf_counter()
        for _ in range(n):
            q.add("noop", {"t": time.time()}, options)
        return n / (time.perf_counter() - start)


def sdk_bulk(port: int, queues: Sequence[str], n: int, size: int, durable: bool) -> float:
    from shardq.client import Connection, Queue

    conn = Connection(_url(port))
    qs = [Queue(name, connection=conn) for name in queues]
    options = _options(durable)
    try:
        start = time.perf_counter()
        for b in range(n // size):
            jobs = [("noop", {"t": time.time()}, options) for _ in range(size)]
            qs[b % len(qs)].add_bulk(jobs, chunk_size=size)
        return (n // size) * size / (time.perf_counter() - start)
    finally:
        conn.close()


def sdk_pipelined(port: int, queues: Sequence[str], n: int, window: int, durable: bool) -> float:
    from shardq.client import AsyncConnection, AsyncQueue

    async def go() -> float:
        conn = AsyncConnection(_url(port))
        qs = [AsyncQueue(name, connection=conn) for name in queues]
        sem = asyncio.Semaphore(window)
        options = _options(durable)

        async def one(i: int) -> None:
            async with sem:
                await qs[i % len(qs)].add("noop", {"t": time.time()}, options)

        try:
            start = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n)))
            return n / (time.perf_counter() - start)
        finally:
            await conn.close()

    return asyncio.run(go())


def sdk_runner(sc: Scenario) -> Runner | None:
    durable = sc.mode == "durable"
    if sc.kind == "push":
        return lambda port, qs, s, st: sdk_single(port, qs, s.jobs(st), durable)
    if sc.kind == "bulk":
        return lambda port, qs, s, st: sdk_bulk(port, qs, s.jobs(st), s.batch, durable)
    if sc.kind == "pipelined":
        return lambda port, qs, s, st: sdk_pipelined(port, qs, s.jobs(st), s.batch, durable)
    return None


def _handler(job: Any) -> None:
    data = job.data
    record(float(data.get("t", 0.0)) if isinstance(data, dict) else 0.0)


def start_sdk_workers(port: int, queues: Sequence[str], concurrency: int) -> list[object]:
    """One started `Worker` per queue; returned so the caller keeps them alive."""
    from shardq.client import Worker

    return [Worker(q, _handler, concurrency=concurrency, url=_url(port)).start() for q in queues]


def sdk_offer(port: int, queue: str, rate: float, n: int) -> None:
    from shardq.client import Queue

    with Queue(queue, _url(port)) as q:
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            q.add("noop", {"t": time.time()})
