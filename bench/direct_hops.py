"""The server's side of one single push, counted: wake-ups and CPU per request (issue 24).

    python -m bench.direct_hops [--requests 3000] [--rounds 2] [--json P]

Starts `shardq start --shards 2` once with `direct_shards` off and once with it on,
alternating, `--rounds` times each. In each, one client (`Queue.add` over TCP, the path the
direct port serves) pushes `--requests` jobs one at a time, buffered and then durable. Per
request it reports, summed over every process and thread of the server (from /proc): the
voluntary context switches (each one a sleep that a message ended: a wake-up) and the CPU
time, and the client's wall time per request (p50, p99). The counts do not depend on the
machine's load; the times do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.getcwd())

from bench._server import ShardqProcess

__all__ = ["main", "server_counts"]

_TICK = os.sysconf("SC_CLK_TCK")
_WARM = 200


def _tree(root: int) -> list[int]:
    """`root` and its descendants (Linux /proc)."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        todo.extend(int(c) for c in children)
    return pids


def server_counts(root: int) -> tuple[int, float]:
    """(voluntary context switches, CPU seconds) over every thread of the server's tree."""
    switches, cpu = 0, 0.0
    for pid in _tree(root):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    switches += int(line.split()[1])
            fields = stat.rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return switches, cpu


def _measure(server: ShardqProcess, durable: bool, requests: int) -> dict[str, float]:
    from shardq.client import Queue

    queue = Queue(f"hops-{'durable' if durable else 'buffered'}",
                  url=f"tcp://127.0.0.1:{server.tcp_port}")  # fmt: skip
    options = {"durable": True} if durable else None
    try:
        for _ in range(_WARM):
            queue.add("j", {"n": 1}, options)
        s0, c0 = server_counts(server.proc.pid)
        times = []
        for _ in range(requests):
            t = time.perf_counter()
            queue.add("j", {"n": 1}, options)
            times.append(time.perf_counter() - t)
        s1, c1 = server_counts(server.proc.pid)
        direct = queue.connection.direct
        used = direct.used if direct is not None else 0
    finally:
        queue.close()
    times.sort()
    return {
        "wakeups_per_request": (s1 - s0) / requests,
        "server_cpu_us_per_request": (c1 - c0) / requests * 1e6,
        "p50_us": statistics.median(times) * 1e6,
        "p99_us": times[int(len(times) * 0.99)] * 1e6,
        "direct_share": used / (requests + _WARM),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for k in range(args.rounds):
        for direct in (False, True):
            env = {**os.environ, "SHARDQ_DIRECT_SHARDS": "true" if direct else "false"}
            server = ShardqProcess("2", env=env)
            try:
                time.sleep(0.5)  # the shards announce their ports as the front end links up
                for durable in (False, True):
                    got = _measure(server, durable, args.requests)
                    row = {"round": k + 1, "direct": direct, "durable": durable, **got}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                server.stop()
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
