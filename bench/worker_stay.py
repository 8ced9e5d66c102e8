"""Where a long-running bunqueue-client `Worker` is served: its shard or the front end.

    python -m bench.worker_stay [--seconds 30] [--rate 400] [--heartbeat 10]

One `shardq start --shards 2` (`tcp_handoff` on, the defaults otherwise); one bunqueue-client
0.1.5 `Worker` (concurrency 50, its default 5 s long-poll and `--heartbeat` period) on one
queue, fed by a producer that pushes `--rate` jobs a second in bulks of a tenth of that, for
`--seconds` (so the queue is often empty, and the Worker's long-polls wait: the production
shape the short drain benchmarks never reach). Printed: the jobs pulled on its shard
(`directPulled`) against all it ran, the connections taken and given back (`handedOff`,
`handedBack`), and each server process's CPU time per job (the front end's is the hop a
handed-off connection saves).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench._server import ShardqProcess
from bench.direct_hops import _TICK, _tree
from bench.durable_hops import _role

__all__ = ["main"]


def _cpu_by_role(root: int) -> dict[str, float]:
    """CPU seconds of the server's front end and of its other processes (shards, writer),
    told apart by their command line (`durable_hops._role`)."""
    out: dict[str, float] = {}
    for pid in _tree(root):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        role = "frontend" if _role(pid) == "frontend" else "others"
        fields = stat.rsplit(")", 1)[1].split()
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


def _produce(port: int, queue: str, rate: int, seconds: float, stop: threading.Event) -> None:
    from bunqueue import Queue

    q = Queue(queue, host="127.0.0.1", port=port)
    try:
        bulk = max(1, rate // 10)
        start = time.monotonic()
        k = 0
        while not stop.is_set() and time.monotonic() - start < seconds:
            q.add_bulk([{"name": "j", "data": {"k": k, "i": i}} for i in range(bulk)])
            k += 1
            stop.wait(max(0.0, start + k * 0.1 - time.monotonic()))
    finally:
        q.close()


def run(seconds: float, rate: int, heartbeat: float) -> dict[str, Any]:
    from bunqueue import Worker

    server = ShardqProcess("2", env={**os.environ, "SHARDQ_TCP_HANDOFF": "true"})
    ran = [0]
    lock = threading.Lock()

    def process(_job: Any) -> None:
        with lock:
            ran[0] += 1

    try:
        time.sleep(1.0)  # the direct ports announced
        before = _cpu_by_role(server.proc.pid)
        worker = Worker("stay", process, host="127.0.0.1", port=server.tcp_port,
                        concurrency=50, heartbeat_interval_s=heartbeat)  # fmt: skip
        stop = threading.Event()
        try:
            _produce(server.tcp_port, "stay", rate, seconds, stop)
            deadline = time.monotonic() + 30
            while ran[0] < int(seconds * 10) * max(1, rate // 10) and time.monotonic() < deadline:
                time.sleep(0.1)
            stats = worker.connection.call({"cmd": "Stats"})["stats"]
        finally:
            stop.set()
            worker.close(timeout=10)
        after = _cpu_by_role(server.proc.pid)
    finally:
        server.stop()
    jobs = max(1, ran[0])
    return {
        "jobs": ran[0],
        "directPulled": stats.get("directPulled"),
        "directCompleted": stats.get("directCompleted"),
        "handedOff": stats.get("handedOff"),
        "handedBack": stats.get("handedBack"),
        "cpu_us_per_job": {
            k: round((after.get(k, 0.0) - v) / jobs * 1e6, 1) for k, v in before.items()
        },
        "load": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=400)
    parser.add_argument("--heartbeat", type=float, default=10.0)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.seconds, args.rate, args.heartbeat)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
