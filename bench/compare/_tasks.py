"""shardq driven through its task API (`shardq.App`) in the comparison, as the Python peers
are through theirs: `noop.delay()` one by one, `noop.map()` in bulk, and `shardq worker
bench.compare.peer_shardq:app` for drains and latency."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.compare._model import Scenario, Settings
from bench.compare._procs import Child, Procs

__all__ = ["TasksTarget", "task_client", "tasks_runner", "worker_label"]

REPO = Path(__file__).resolve().parents[2]
Runner = Callable[[int, Sequence[str], Scenario, Settings], float]


def task_client(sc: Scenario) -> str:
    """The client column of an issue-15 row; it starts with the contestant's name."""
    if sc.kind == "bulk":
        return "shardq-tasks: task.map (one PUSHB per call)"
    if sc.kind == "drain":
        return "shardq-tasks: " + worker_label(sc.processes)
    return "shardq-tasks: task.delay"


def worker_label(processes: int = 1) -> str:
    if processes > 1:
        return f"task.delay; worker: shardq worker --processes {processes} --concurrency <c>"
    return "shardq worker (task API, 1 process, SDK worker defaults)"


def _app(port: int) -> object:
    from bench.compare import peer_shardq

    peer_shardq.app.close()
    peer_shardq.app.url = f"tcp://127.0.0.1:{port}"
    return peer_shardq.app


def tasks_single(port: int, queues: Sequence[str], n: int, durable: bool) -> float:
    from bench.compare.peer_shardq import noop

    _app(port)
    start = time.perf_counter()
    for _ in range(n):
        noop.apply((time.time(),), queue=queues[0], durable=durable or None)
    return n / (time.perf_counter() - start)


def tasks_bulk(port: int, queues: Sequence[str], n: int, size: int, durable: bool) -> float:
    from bench.compare.peer_shardq import noop

    _app(port)
    start = time.perf_counter()
    for b in range(n // size):
        calls = [(time.time(),) for _ in range(size)]
        noop.map(calls, queue=queues[b % len(queues)], durable=durable or None)
    return (n // size) * size / (time.perf_counter() - start)


def tasks_runner(sc: Scenario) -> Runner | None:
    durable = sc.mode == "durable"
    if sc.kind == "push":
        return lambda port, qs, s, st: tasks_single(port, qs, s.jobs(st), durable)
    if sc.kind == "bulk":
        return lambda port, qs, s, st: tasks_bulk(port, qs, s.jobs(st), s.batch, durable)
    return None


@dataclass
class TasksTarget:
    """Fill with `noop.map`, drain with `shardq worker`, offer load with `noop.delay`."""

    port: int
    processes: int = 1  # > 1: `shardq worker --processes`, concurrency per process

    def fill(self, n: int, queues: Sequence[str]) -> None:
        from bench.compare.peer_shardq import noop

        _app(self.port)
        for i, queue in enumerate(queues):
            share = n // len(queues) + (1 if i < n % len(queues) else 0)
            noop.map([(time.time(),) for _ in range(share)], queue=queue)

    def start_workers(
        self, procs: Procs, concurrency: int, queues: Sequence[str], record_file: Path
    ) -> Child:
        per_queue = max(1, concurrency // len(queues))
        args = [sys.executable, "-m", "shardq_cli.main", "worker",
                "bench.compare.peer_shardq:app", "--url", f"tcp://127.0.0.1:{self.port}",
                "--queues", ",".join(queues), "--concurrency", str(per_queue),
                "--processes", str(self.processes), "--log-level", "warning"]  # fmt: skip
        env = {"BENCH_RECORD_FILE": str(record_file), "PYTHONPATH": str(REPO)}
        return procs.spawn("shardq-tasks-worker", args, env=env, cwd=REPO)

    def offer(self, rate: float, n: int, queue: str) -> None:
        from bench.compare.peer_shardq import noop

        _app(self.port)
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            noop.apply((time.time(),), queue=queue)
