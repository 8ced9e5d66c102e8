"""CPU time per job of the task API against the raw client, on a real server: what the
compare's `tasks_push_single`, `push_single` and `tasks_drain_2p` do, counted in CPU time.

    python -m bench.tasks_cpu [--calls 3000] [--jobs 20000] [--rounds 3]

Wall-clock rates on a shared 2-core machine move by 2x with the other load; CPU time per job
moves far less. One server (`shardq start`, default settings, HTTP off); per round:

- `push`: `--calls` sequential `Queue.add("noop", {"t": ...})` on a connection of its own (the
  compare's `push_single` for shardq's client), then as many `noop.apply((t,), queue=...)`
  (its `tasks_push_single`), alternated. Per call: the client's CPU (this process) and the
  server's (every process of its tree, from /proc), and jobs/s;
- `drain`: `shardq worker bench.compare.peer_shardq:app --processes 2 --concurrency 10`
  started on an empty queue and given 2 s to start, then `--jobs` task jobs pushed with
  `noop.map` (1,000 per call) and drained. Per job: the worker processes' CPU and the
  server's (the pushes included), and the drain rate between the first and the last
  completion (each job appends a line to a file, as in the compare).

The server's idle CPU (its timers) is measured over 1 s before each round and taken off.
Medians over rounds. Uses only APIs older than itself: the same file measures another
checkout when run there with that checkout's interpreter, e.g.
`cd /work/s9start && .venv/bin/python /work/wt/delay/bench/tasks_cpu.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a file from another checkout: use its `bench`
    sys.path.insert(0, os.getcwd())

from bench._server import ShardqProcess
from bench.compare._record import RECORD_ENV, count, read

__all__ = ["main"]

TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """`pid` and every process below it."""
    out, i = [pid], 0
    while i < len(out):
        for path in Path(f"/proc/{out[i]}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                out += [int(x) for x in path.read_text().split()]
        i += 1
    return out


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of `pids` (those still there)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


class Server:
    def __init__(self) -> None:
        self.proc = ShardqProcess("auto")
        self.pids = tree(self.proc.proc.pid)
        self.url = f"tcp://127.0.0.1:{self.proc.tcp_port}"

    def idle_rate(self) -> float:
        """CPU seconds per second the idle server spends."""
        start, c0 = time.perf_counter(), cpu_s(self.pids)
        time.sleep(1.0)
        return (cpu_s(self.pids) - c0) / (time.perf_counter() - start)

    def settle(self) -> None:
        time.sleep(0.3)  # the writer's flush of the last jobs


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM a worker process and wait for it; SIGKILL it after 30 s."""
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _push_round(server: Server, calls: int, tag: str) -> dict[str, list[float]]:
    from bench.compare.peer_shardq import app, noop
    from shardq.client import Queue

    app.close()
    app.url = server.url
    raw = Queue(f"raw-{tag}", server.url)
    variants: list[tuple[str, Callable[[], object]]] = [
        ("raw Queue.add", lambda: raw.add("noop", {"t": time.time()}, None)),
        ("task apply", lambda: noop.apply((time.time(),), queue=f"tasks-{tag}", durable=None)),
    ]
    out: dict[str, list[float]] = {}
    idle = server.idle_rate()
    for name, call in variants:
        call()  # connections open
        s0, c0, w0 = cpu_s(server.pids), time.process_time(), time.perf_counter()
        for _ in range(calls):
            call()
        wall = time.perf_counter() - w0
        client = time.process_time() - c0
        server.settle()
        spent = cpu_s(server.pids) - s0 - idle * (time.perf_counter() - w0)
        out[name] = [calls / wall, client / calls * 1e6, spent / calls * 1e6]
    raw.close()
    app.close()
    return out


def _drain_round(server: Server, jobs: int, tag: str) -> list[float]:
    from bench.compare.peer_shardq import app, noop

    queue = f"drain-{tag}"
    records = Path(tempfile.mkdtemp(prefix="tasks-cpu-")) / "done.rec"
    args = [sys.executable, "-m", "shardq_cli.main", "worker", "bench.compare.peer_shardq:app",
            "--url", server.url, "--queues", queue, "--concurrency", "10", "--processes", "2",
            "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, RECORD_ENV: str(records), "PYTHONPATH": os.getcwd()}
    worker = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)  # imported, forked, connected
        pids = tree(worker.pid)
        idle = server.idle_rate()
        w_cpu0, s_cpu0, start = cpu_s(pids), cpu_s(server.pids), time.perf_counter()
        app.close()
        app.url = server.url
        for i in range(0, jobs, 1000):
            noop.map([(time.time(),) for _ in range(min(1000, jobs - i))], queue=queue)
        deadline = time.monotonic() + 120
        while count(str(records)) < jobs and time.monotonic() < deadline:
            time.sleep(0.05)
        w_cpu = cpu_s(pids) - w_cpu0
        server.settle()
        s_cpu = cpu_s(server.pids) - s_cpu0 - idle * (time.perf_counter() - start)
        done = read(str(records))
        span = done[-1][0] - done[0][0] if len(done) > 1 else float("nan")
    finally:
        stop_worker(worker)
        app.close()
    return [len(done) / span, w_cpu / len(done) * 1e6, s_cpu / len(done) * 1e6]


def _cells(samples: list[list[float]]) -> str:
    med = [statistics.median(col) for col in zip(*samples, strict=True)]
    spread = [(min(col), max(col)) for col in zip(*samples, strict=True)]
    return " | ".join(
        f"{m:,.1f} ({lo:,.1f}-{hi:,.1f})" for m, (lo, hi) in zip(med, spread, strict=True)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip", default="", help="push or drain: leave that part out")
    args = parser.parse_args(argv)
    server = Server()
    pushes: dict[str, list[list[float]]] = {}
    drains: list[list[float]] = []
    try:
        for r in range(args.rounds):
            if args.skip != "push":
                for name, row in _push_round(server, args.calls, f"{os.getpid()}-{r}").items():
                    pushes.setdefault(name, []).append(row)
            if args.skip != "drain":
                drains.append(_drain_round(server, args.jobs, f"{os.getpid()}-{r}"))
    finally:
        server.proc.stop()
    print(f"load {os.getloadavg()[0]:.1f}; medians of {args.rounds} rounds (min-max)\n")
    if pushes:
        print("| client | jobs/s | client CPU µs/call | server CPU µs/call |\n|---|---:|---:|---:|")
        for name, rows in pushes.items():
            print(f"| {name} | {_cells(rows)} |")
    if drains:
        print("\n| 2-process task drain | jobs/s | workers' CPU µs/job | server CPU µs/job |")
        print(f"|---|---:|---:|---:|\n| {args.jobs:,} jobs | {_cells(drains)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
