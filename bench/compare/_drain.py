"""End-to-end measurements shared by every contestant: drain throughput and latency under load.

Drain: push N jobs, start the worker process(es), and count completions from the shared record
file (`_record`). The rate is taken between the first and the last completion, so worker start-up
(imports, forks, connections) is not counted; the count stops `drain_window_s` after the first
completion, so a slow peer is measured on what it finished in that window.

Latency: start the workers, warm them up, then push at a fixed rate; every job carries its push
time and its worker records `completed_at - pushed_at`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bench.compare import _record
from bench.compare._model import Measurement, Settings, percentile
from bench.compare._procs import Child, Procs, cpu_of

__all__ = ["DrainTarget", "drain_once", "latency_once"]

WARMUP_JOBS = 20
START_TIMEOUT_S = 60.0


class DrainTarget(Protocol):
    """How one contestant fills a queue, starts its workers and offers load."""

    def fill(self, n: int, queues: Sequence[str]) -> None: ...

    def start_workers(
        self, procs: Procs, concurrency: int, queues: Sequence[str], record_file: Path
    ) -> Child: ...

    def offer(self, rate: float, n: int, queue: str) -> None: ...


@dataclass
class _Wait:
    done: int
    first_at: float | None
    done_at_first: int = 0  # the records seen at the first look that found any
    cpu_at_first: float = 0.0  # the worker's CPU seconds then (all its processes)


def _wait_for(record_file: Path, n: int, worker: Child, window_s: float) -> _Wait:
    """Wait until `n` records, or `window_s` after the first one, or the start-up timeout."""
    path = str(record_file)
    start = time.monotonic()
    first_at: float | None = None
    at_first = (0, 0.0)
    while True:
        done = _record.count(path)
        now = time.monotonic()
        if done and first_at is None:
            members = worker.members()  # the slow part first: CPU and count then read together
            at_first = (_record.count(path), cpu_of(members))
            first_at = now
        if done >= n:
            break
        if first_at is None and now - start > START_TIMEOUT_S:
            break
        if first_at is not None and now - first_at > window_s:
            break
        if not worker.alive():
            raise RuntimeError(f"{worker.name} exited:\n{worker.log_tail()}")
        time.sleep(0.02)
    return _Wait(_record.count(path), first_at, *at_first)


def drain_once(
    procs: Procs,
    target: DrainTarget,
    n: int,
    concurrency: int,
    queues: Sequence[str],
    settings: Settings,
    m: Measurement,
) -> None:
    """One drain sample into `m`: jobs/s between the first and the last completion."""
    record_file = procs.tempdir("bench-records-") / "done.rec"
    target.fill(n, queues)
    worker = target.start_workers(procs, concurrency, queues, record_file)
    with procs.running(worker):
        got = _wait_for(record_file, n, worker, settings.drain_window_s)
        members = worker.members()
        done = _record.count(str(record_file)) - got.done_at_first
        cpu = cpu_of(members) - got.cpu_at_first
    times = sorted(t for t, _ in _record.read(str(record_file)))
    if len(times) < 2 or times[-1] <= times[0]:
        raise RuntimeError(f"{worker.name}: {len(times)} jobs completed, no rate:\n"
                           f"{worker.log_tail()}")  # fmt: skip
    m.samples.append((len(times) - 1) / (times[-1] - times[0]))
    m.add_extra("completed", float(len(times)))
    if done > 0:  # none when every job was done by the first look (a small N)
        m.add_extra("client_cpu_us", cpu * 1e6 / done)


def latency_once(
    procs: Procs,
    target: DrainTarget,
    concurrency: int,
    queue: str,
    settings: Settings,
    m: Measurement,
) -> None:
    """One latency sample into `m`: p50 (the sample) and p99 of push-to-complete, in ms."""
    record_file = procs.tempdir("bench-records-") / "done.rec"
    n = max(10, int(settings.offered_rate * settings.offered_seconds))  # = Scenario.jobs
    worker = target.start_workers(procs, concurrency, [queue], record_file)
    with procs.running(worker):
        target.offer(settings.offered_rate, WARMUP_JOBS, queue)
        _wait_for(record_file, WARMUP_JOBS, worker, window_s=30.0)
        target.offer(settings.offered_rate, n, queue)
        got = _wait_for(record_file, WARMUP_JOBS + n, worker, window_s=30.0)
    latencies = [lat * 1000 for _, lat in _record.read(str(record_file))[WARMUP_JOBS:]]
    if not latencies:
        raise RuntimeError(f"{worker.name}: no job completed under load:\n{worker.log_tail()}")
    m.samples.append(percentile(latencies, 50))
    m.add_extra("p99_ms", percentile(latencies, 99))
    m.add_extra("completed", float(got.done - WARMUP_JOBS))
