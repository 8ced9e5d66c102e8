"""The compare's `tasks_drain_2p` shape, counted per job: a queue filled while paused, then
drained by `shardq worker --processes 2 --concurrency 10`, timed and counted from the resume.

    python -m bench.task_drain [--jobs 20000] [--rounds 3] [--strace] [--pyspy DIR]

Per round and per job: the drain rate (first to last completion, as the compare takes it),
the worker processes' CPU, the server's CPU (the drain only: the fill is done before), and
with `--strace` the worker processes' syscalls per job (`strace -f -c` attached to each
worker child for the drain; it slows them, so the rate of such a round is not comparable).
`--pyspy DIR` records one worker child with py-spy (`--gil --threads`, raw folded stacks)
into DIR. `--concurrency` and `--processes` as for `shardq worker`; `--worker-arg=--x
--worker-arg=1` passes more (e.g. `--thread-ramp`).

Uses only APIs older than itself: run it from another checkout with that checkout's
interpreter (`cd /work/s10start && .venv/bin/python /work/wt/task-drain/bench/task_drain.py`)
to measure that build.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file from another checkout: use its `bench`
    sys.path.insert(0, os.getcwd())

from bench.compare._record import RECORD_ENV, count, read
from bench.tasks_cpu import Server, cpu_s, stop_worker, tree

__all__ = ["main"]

START_S = 1.5  # after the fork: connected, long-polling
START_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 120.0


def _children(pid: int) -> list[int]:
    return [p for p in tree(pid) if p != pid]


def _started(pid: int, processes: int) -> list[int]:
    """The worker's child processes, once all are forked, and `START_S` more to connect."""
    if processes == 1:  # `shardq worker` serves in its own process
        time.sleep(START_S + 1.0)
        return [pid]
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(_children(pid)) < processes and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(START_S)
    return _children(pid)


def _strace(pids: list[int], out: Path) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(["strace", "-f", "-c", "-o", str(out) + f".{pid}", "-p", str(pid)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for pid in pids
    ]  # fmt: skip


def _syscalls(out: Path, pids: list[int]) -> dict[str, int]:
    """Calls per syscall, summed over the strace summaries of `pids`."""
    total: dict[str, int] = {}
    for pid in pids:
        path = Path(str(out) + f".{pid}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
            if m and m.group(2) != "total":
                total[m.group(2)] = total.get(m.group(2), 0) + int(m.group(1))
    return total


def _round(server: Server, args: argparse.Namespace, tag: str) -> dict[str, float]:
    from bench.compare.peer_shardq import app, noop
    from shardq.client import Queue

    queue = f"drain-{tag}"
    tmp = Path(tempfile.mkdtemp(prefix="task-drain-"))
    records = tmp / "done.rec"
    app.close()
    app.url = server.url
    q = Queue(queue, server.url)
    q.pause()
    for i in range(0, args.jobs, 1000):
        noop.map([(time.time(),) for _ in range(min(1000, args.jobs - i))], queue=queue)
    cmd = [sys.executable, "-m", "shardq_cli.main", "worker", "bench.compare.peer_shardq:app",
           "--url", server.url, "--queues", queue, "--concurrency", str(args.concurrency),
           "--processes", str(args.processes), "--log-level", "warning",
           *args.worker_arg]  # fmt: skip
    env = {**os.environ, RECORD_ENV: str(records), "PYTHONPATH": os.getcwd()}
    worker = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tracers: list[subprocess.Popen[bytes]] = []
    kids: list[int] = []
    try:
        kids = _started(worker.pid, args.processes)
        if args.strace:
            tracers = _strace(kids, tmp / "strace")
            time.sleep(1.0)
        if args.pyspy and kids:
            spy_out = Path(args.pyspy) / f"worker-{tag}.txt"
            tracers.append(subprocess.Popen(
                ["py-spy", "record", "--pid", str(kids[0]), "--format", "raw", "--threads",
                 "--rate", "500", "--duration", "8", "--gil", "--output", str(spy_out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
            time.sleep(0.5)
        idle = server.idle_rate() if not args.strace else 0.0
        w0, s0, start = cpu_s(kids), cpu_s(server.pids), time.perf_counter()
        q.resume()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while count(str(records)) < args.jobs and time.monotonic() < deadline:
            time.sleep(0.02)
        w_cpu = cpu_s(kids) - w0
        server.settle()
        s_cpu = cpu_s(server.pids) - s0 - idle * (time.perf_counter() - start)
    finally:
        for tracer in tracers[: len(kids) if args.strace else 0]:  # strace's, not py-spy's
            if tracer.poll() is None:
                tracer.send_signal(signal.SIGINT)
        for tracer in tracers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                tracer.wait(15)
        stop_worker(worker)
        q.close()
        app.close()
    done = sorted(t for t, _ in read(str(records)))
    n = len(done)
    row = {"jobs/s": (n - 1) / (done[-1] - done[0]) if n > 1 else float("nan"),
           "worker µs/job": w_cpu / n * 1e6, "server µs/job": s_cpu / n * 1e6}  # fmt: skip
    if args.strace:
        calls = _syscalls(tmp / "strace", kids)
        for name in ("futex", "write", "sendto", "recvfrom", "epoll_wait", "read", "getpid"):
            row[f"{name}/job"] = calls.get(name, 0) / n
        row["syscalls/job"] = sum(calls.values()) / n
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--strace", action="store_true")
    parser.add_argument("--worker-arg", action="append", default=[],
                        help="one more argument for `shardq worker` (repeat it)")
    parser.add_argument("--pyspy", default="")
    args = parser.parse_args(argv)
    server = Server()
    rows: list[dict[str, float]] = []
    try:
        for r in range(args.rounds):
            rows.append(_round(server, args, f"{os.getpid()}-{r}"))
    finally:
        server.proc.stop()
    print(f"load {os.getloadavg()[0]:.1f}; {args.jobs:,} jobs, medians of {args.rounds} rounds"
          " (min-max)")  # fmt: skip
    for key in rows[0]:
        col = [row[key] for row in rows]
        print(f"| {key} | {statistics.median(col):,.2f} ({min(col):,.2f}-{max(col):,.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
