"""Throughput of shardq's own client (`shardq.client`) against a real `shardq start`.

    python -m bench.clients [--jobs 20000] [--repeats 3] [--shards auto] [--transports tcp zmq]

Scenarios, per transport: `Queue.add` one at a time (one request in flight), the same with
`AsyncQueue`, `AsyncQueue.add` with 100 calls in flight, `Queue.add_bulk` (PUSHB of 1000, 4 in
flight), and end-to-end drains: the queue is filled with `add_bulk`, then a `Worker` with a
no-op handler runs until the server counts every job completed. Drains run the worker with its
defaults (prefetch buffer, batched ACKs) at concurrency 1, 10 and 50, with an async handler at
10, and, for reference, with `prefetch=0, ack_batch=False` (pull for free handlers only, one
ACK per job) at 50. Buffered pushes (no `durable`); each run's queue is obliterated after it.
Client and server share the machine's cores. Besides jobs/s, each row gives the client
process's CPU time per job (all its threads, `time.process_time`) over the timed part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench._server import ShardqProcess
from shardq.client import AsyncQueue, Job, Queue, Worker


@dataclass(frozen=True)
class Sample:
    rate: float  # jobs/s
    cpu_us: float  # client CPU per job, microseconds


class Clock:
    """Wall-clock and process CPU time from its creation: the timed part of a run."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def sample(self, n: int) -> Sample:
        wall, cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        return Sample(n / wall, cpu / n * 1e6)


Scenario = Callable[[str, str, int], Sample]  # (url, queue, jobs) -> one sample

SINGLE_SHARE = 10  # single adds are slow: they run jobs // 10


def add_sequential(url: str, queue: str, n: int) -> Sample:
    with Queue(queue, url=url) as q:
        q.counts()  # connect outside the timing
        clock = Clock()
        for i in range(n):
            q.add("bench", {"i": i})
        return clock.sample(n)


def add_sequential_async(url: str, queue: str, n: int) -> Sample:
    async def run() -> Sample:
        async with AsyncQueue(queue, url=url) as q:
            await q.counts()
            clock = Clock()
            for i in range(n):
                await q.add("bench", {"i": i})
            return clock.sample(n)

    return asyncio.run(run())


def add_pipelined_async(url: str, queue: str, n: int) -> Sample:
    async def run() -> Sample:
        async with AsyncQueue(queue, url=url) as q:
            await q.counts()
            window = asyncio.Semaphore(100)

            async def one(i: int) -> None:
                async with window:
                    await q.add("bench", {"i": i})

            clock = Clock()
            await asyncio.gather(*(one(i) for i in range(n)))
            return clock.sample(n)

    return asyncio.run(run())


def add_bulk(url: str, queue: str, n: int) -> Sample:
    with Queue(queue, url=url) as q:
        q.counts()
        clock = Clock()
        q.add_bulk(("bench", {"i": i}) for i in range(n))
        return clock.sample(n)


def noop(job: Job) -> None:
    return None


async def async_noop(job: Job) -> None:
    return None


def drain(concurrency: int, handler: Callable[[Job], Any] = noop, **options: Any) -> Scenario:
    def run(url: str, queue: str, n: int) -> Sample:
        with Queue(queue, url=url) as q:
            q.add_bulk(("bench", {"i": i}) for i in range(n))
            worker = Worker(queue, handler, url=url, concurrency=concurrency,
                            poll_timeout_ms=500, **options)  # fmt: skip
            clock = Clock()
            worker.start()
            while q.counts().completed < n:
                time.sleep(0.02)
            sample = clock.sample(n)
            worker.close()
            return sample

    return run


ONE_AT_A_TIME: dict[str, Any] = {"prefetch": 0, "ack_batch": False}  # the old behaviour

SCENARIOS: dict[str, tuple[Scenario, int]] = {
    # name: (function, share of --jobs it runs)
    "add, sequential (Queue)": (add_sequential, SINGLE_SHARE),
    "add, sequential (AsyncQueue)": (add_sequential_async, SINGLE_SHARE),
    "add, 100 in flight (AsyncQueue)": (add_pipelined_async, 1),
    "add_bulk (PUSHB 1000, 4 in flight)": (add_bulk, 1),
    "worker drain, concurrency 1": (drain(1), 1),
    "worker drain, concurrency 10": (drain(10), 1),
    "worker drain, concurrency 50": (drain(50), 1),
    "worker drain, concurrency 10, async handler": (drain(10, async_noop), 1),
    "worker drain, concurrency 50, prefetch 0, ACK per job": (drain(50, **ONE_AT_A_TIME), 1),
}


def bench(server: ShardqProcess, transport: str, jobs: int, repeats: int) -> list[dict[str, Any]]:
    port = server.tcp_port if transport == "tcp" else server.zmq_port
    url = f"{transport}://127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    for k, (name, (fn, share)) in enumerate(SCENARIOS.items()):
        rates, cpus = [], []
        for r in range(repeats):
            queue = f"c{k}-{transport}-{r}"
            sample = fn(url, queue, jobs // share)
            rates.append(sample.rate)
            cpus.append(sample.cpu_us)
            with Queue(queue, url=url) as q:
                # Completed jobs stay in the shard's memory (up to 50,000) and make its
                # GC slower: start every run from an empty server, as the first one does.
                q.obliterate()
        rows.append({"transport": transport, "scenario": name, "jobs": jobs // share,
                     "median": statistics.median(rates), "min": min(rates),
                     "max": max(rates), "client_cpu_us": statistics.median(cpus)})  # fmt: skip
        print_row(rows[-1])
    return rows


def print_row(row: dict[str, Any]) -> None:
    print(
        f"| {row['transport']} | {row['scenario']} | {row['jobs']:,} | {row['median']:,.0f} | "
        f"{row['min']:,.0f} | {row['max']:,.0f} | {row['client_cpu_us']:,.1f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="auto")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transports", nargs="+", default=["tcp", "zmq"])
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    server = ShardqProcess(args.shards)
    print(f"# python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"shards={server.ready.get('shards', args.shards)}, jobs={args.jobs}, "
          f"repeats={args.repeats}")  # fmt: skip
    print("| transport | scenario | jobs | median jobs/s | min | max | client CPU µs/job |")
    print("|---|---|---:|---:|---:|---:|---:|")
    try:
        rows = [row for t in args.transports for row in bench(server, t, args.jobs, args.repeats)]
    finally:
        server.stop()
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"cpus": os.cpu_count(), "jobs": args.jobs, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
