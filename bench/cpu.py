"""CPU microseconds per job of each process of a real `shardq start`, under one client.

    python -m bench.cpu [--scenario ppa|pushb] [--shards 1] [--seconds 8] [--repeats 3]

The client runs rounds on a fresh queue each: 20 PUSHB of 100 (8 in flight), then, for `ppa`,
PULLB 100 + ACKB until the queue is empty. After `--seconds` it finishes its round, waits until
the writer has committed everything (its CPU clock stops moving), and reads each process's CPU
time from /proc. Dividing by the jobs of the whole run counts the work a lagging writer does
after the client is done, which a jobs/s window misses. CPU time, unlike jobs/s, barely moves
when other work shares the machine. Linux only (/proc). The client's one connection talks to
one shard only, so the front end hands it to that shard after a few requests (`tcp_handoff`):
the front end's column then reads about 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import threading
import time
from typing import Any

from bench._server import ShardqProcess
from shardq.client import TcpConnection

ROLES = ("writer", "shard", "frontend")
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid`, all threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def children(pid: int) -> dict[str, list[int]]:
    """The pids of the supervisor's children, by role."""
    out = subprocess.run(
        ["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True, check=True
    ).stdout
    pids: dict[str, list[int]] = {role: [] for role in ROLES}
    for line in out.splitlines():
        child, args = line.strip().split(None, 1)
        for role in ROLES:
            if f"shardq.runtime.{role}" in args:
                pids[role].append(int(child))
    return pids


def _rounds(port: int, scenario: str, stop: threading.Event, done: list[int]) -> None:
    with TcpConnection("127.0.0.1", port) as conn:
        r = 0
        while not stop.is_set():
            queue, r = f"cpu{r}", r + 1
            pushes = [
                {"cmd": "PUSHB", "queue": queue, "jobs": [{"data": {"i": i}} for i in range(100)]}
                for _ in range(20)
            ]
            conn.call_many(pushes, window=8)
            if scenario == "pushb":
                done[0] += 2000
                continue
            while reply := conn.call({"cmd": "PULLB", "queue": queue, "count": 100,
                                      "owner": "bench"}):  # fmt: skip
                if not reply["jobs"]:
                    break
                ids = [job["id"] for job in reply["jobs"]]
                conn.call({"cmd": "ACKB", "ids": ids, "tokens": reply["tokens"]})
                done[0] += len(ids)


def _settle(pids: list[int], quiet_s: float = 0.5, timeout_s: float = 60.0) -> None:
    """Wait until these processes use no CPU for `quiet_s`: everything sent is committed."""
    deadline = time.monotonic() + timeout_s
    last = sum(cpu_seconds(p) for p in pids)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = sum(cpu_seconds(p) for p in pids)
        if now == last:
            return
        last = now


def run_once(scenario: str, shards: str, seconds: float) -> dict[str, Any]:
    server = ShardqProcess(shards)
    try:
        pids = children(server.proc.pid)
        everyone = [p for role in ROLES for p in pids[role]]
        _settle(everyone)
        before = {role: sum(cpu_seconds(p) for p in pids[role]) for role in ROLES}
        client_before = time.process_time()
        stop, done = threading.Event(), [0]
        load = threading.Thread(target=_rounds, args=(server.tcp_port, scenario, stop, done))
        started = time.perf_counter()
        load.start()
        time.sleep(seconds)
        stop.set()
        load.join()
        elapsed = time.perf_counter() - started
        client = time.process_time() - client_before
        _settle(everyone)
        spent = {role: sum(cpu_seconds(p) for p in pids[role]) - before[role] for role in ROLES}
    finally:
        server.stop()
    jobs = done[0]
    row: dict[str, Any] = {"jobs": jobs, "jobs_per_s": jobs / elapsed}
    row.update({f"{role}_us": spent[role] / jobs * 1e6 for role in ROLES})
    row["client_us"] = client / jobs * 1e6
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("ppa", "pushb"), default="ppa")
    parser.add_argument("--shards", default="1")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    keys = ("writer_us", "shard_us", "frontend_us", "client_us", "jobs_per_s")
    print(f"# {args.scenario}, shards={args.shards}, {args.seconds:g} s per run; CPU µs per job")
    print("| run | writer | shards | front end | client | jobs/s |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = []
    for n in range(1, args.repeats + 1):
        rows.append(run_once(args.scenario, args.shards, args.seconds))
        cells = " | ".join(f"{rows[-1][k]:,.1f}" for k in keys)
        print(f"| {n} | {cells} |", flush=True)
    medians = " | ".join(f"{statistics.median(r[k] for r in rows):,.1f}" for k in keys)
    print(f"| median | {medians} |")


if __name__ == "__main__":
    main()
