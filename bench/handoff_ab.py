"""`tcp_handoff` on and off, alternated: bunqueue-client 0.1.5 against `shardq start --shards 2`.

    python -m bench.handoff_ab [--scenarios single,durable,bulk] [--rounds 3] [--jobs 5000]
                               [--json PATH]

Per round, per scenario, a fresh server with `SHARDQ_TCP_HANDOFF=true` and then one with
`false`; one `bunqueue.Queue` pushes `--jobs` jobs on one connection: `single` one `add` at a
time, `durable` the same with `durable=True`, `bulk` `add_bulk` of 100. Printed per run: the
client's rate (wall clock: noisy on a shared machine), the server's voluntary context switches
and CPU time per job (every thread of every server process, from /proc: what load moves much
less) and the `handedOff` count of Stats (1: the connection was served by its shard).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench._server import ShardqProcess
from bench.direct_hops import server_counts

__all__ = ["main"]


def _push(queue: Any, scenario: str, jobs: int) -> None:
    if scenario == "bulk":
        for _ in range(jobs // 100):
            queue.add_bulk([{"name": "noop", "data": {"t": time.time()}} for _ in range(100)])
        return
    options = {"durable": True} if scenario == "durable" else {}
    for _ in range(jobs):
        queue.add("noop", {"t": time.time()}, **options)


def _run(handoff: bool, scenario: str, jobs: int) -> dict[str, Any]:
    from bunqueue import Queue

    env = {**os.environ, "SHARDQ_TCP_HANDOFF": "true" if handoff else "false"}
    server = ShardqProcess("2", env=env)
    try:
        time.sleep(1.0)  # the shards announce their direct ports as the front end links up
        queue = Queue(f"ab-{scenario}", host="127.0.0.1", port=server.tcp_port)
        try:
            queue.add("warm", {"t": 0})
            s0, c0 = server_counts(server.proc.pid)
            started = time.perf_counter()
            _push(queue, scenario, jobs)
            wall = time.perf_counter() - started
            s1, c1 = server_counts(server.proc.pid)
            stats = queue.connection.call({"cmd": "Stats"})["stats"]
        finally:
            queue.close()
    finally:
        server.stop()
    return {
        "handoff": handoff,
        "scenario": scenario,
        "jobs_per_s": round(jobs / wall),
        "server_wakeups_per_job": round((s1 - s0) / jobs, 2),
        "server_cpu_us_per_job": round((c1 - c0) / jobs * 1e6, 1),
        "handedOff": stats.get("handedOff"),
        "load": round(os.getloadavg()[0], 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenarios", default="single,durable,bulk")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for k in range(args.rounds):
        for scenario in args.scenarios.split(","):
            for handoff in (True, False):
                row = {"round": k + 1, **_run(handoff, scenario, args.jobs)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
