"""The writer process's Python calls and CPU time per job, in a real `shardq start`
(or another server process's, with `--role shard0`, `shard1` or `frontend`).

    python -m bench.writer_prof [--scenario ppa|drain1q|drain8q|push1q|push8q] [--jobs 20000]
                                [--rounds 3] [--shards 1] [--profile] [--top 25]
                                [--executable shardq] [--role writer]

Each round starts a server on free ports with a fresh data directory and runs the scenario
with one raw TCP client. `ppa` is push -> pull -> ack: rounds of 20 PUSHB of 100 (8 in
flight), then PULLB 100 + ACKB until the queue is empty, so a job's put, lease and completion
may share a flush window (as in `bench.cpu`); the others are `bench.cpu_ab`'s scenarios, whose
fill is not measured. The writer's CPU time (from /proc) over the measured part is divided by
the jobs.

`--profile` runs the server with `bench/_prof` on PYTHONPATH (a sitecustomize that profiles a
process between SIGUSR1 and SIGUSR2), profiles the writer over the measured part and prints the
Python calls per job (every call cProfile counts, C functions included: a number other load on
the machine does not change) and the functions that take the most time. cProfile makes every
call dearer, so the CPU times of a profiled round are not comparable with unprofiled ones.
An `--executable` wrapper must keep the PYTHONPATH it is given (append to it, not replace it):
without the sitecustomize, SIGUSR1 would end the writer.
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench._scenarios import (
    ALL_SCENARIOS,
    children,
    connect,
    fill,
    queues_of,
    start_server,
    work,
)
from bench.cpu import cpu_seconds
from shardq.client import TcpConnection

_PROF_PATH = str(Path(__file__).resolve().parent / "_prof")


def _ppa(conn: TcpConnection, jobs: int) -> int:
    done = r = 0
    while done < jobs:
        queue, r = f"ppa{r}", r + 1
        pushes = [
            {"cmd": "PUSHB", "queue": queue, "jobs": [{"data": {"i": i}} for i in range(100)]}
            for _ in range(20)
        ]
        conn.call_many(pushes, window=8)
        while True:
            pulled = conn.call({"cmd": "PULLB", "queue": queue, "count": 100, "owner": "p"})
            if not pulled["jobs"]:
                break
            ids = [job["id"] for job in pulled["jobs"]]
            conn.call({"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"]})
            done += len(ids)
    return done


def _settle(pid: int) -> None:
    """Wait until the writer's CPU clock stops moving: it has committed what the run left."""
    last = cpu_seconds(pid)
    while True:
        time.sleep(0.3)
        now = cpu_seconds(pid)
        if now == last:
            return
        last = now


def run_once(
    executable: str,
    scenario: str,
    jobs: int,
    shards: int,
    prof_dir: str | None,
    role: str = "writer",
) -> tuple[float, int, pstats.Stats | None]:
    """(CPU µs per job of the process `role`, jobs, its profile or None) of one run."""
    env = {"SHARDQ_PROF_DIR": prof_dir, "PYTHONPATH": _PROF_PATH} if prof_dir else None
    with tempfile.TemporaryDirectory(prefix="writer-prof-") as data_dir:
        server, port = start_server(executable, shards, data_dir, env=env)
        try:
            conn = connect(port, server)
            if scenario != "ppa":
                fill(conn, scenario, queues_of(scenario), jobs)
            proc = next(pid for pid, name in children(server.pid) if name == role)
            _settle(proc)
            if prof_dir:
                os.kill(proc, signal.SIGUSR1)
            before = cpu_seconds(proc)
            if scenario == "ppa":
                done = _ppa(conn, jobs)
            else:
                done = work(conn, scenario, queues_of(scenario), jobs)
            _settle(proc)
            spent = cpu_seconds(proc) - before
            stats = None
            if prof_dir:
                os.kill(proc, signal.SIGUSR2)
                path = Path(prof_dir) / f"{proc}.prof"
                deadline = time.monotonic() + 30
                while not path.exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(0.5)  # the dump is written in one go, but let it finish
                stats = pstats.Stats(str(path))
            conn.close()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    return spent * 1e6 / done, done, stats


def _report(stats: pstats.Stats, jobs: int, top: int, role: str) -> None:
    entries = stats.stats  # type: ignore[attr-defined]  # pstats keeps it undeclared
    calls = sum(nc for (_cc, nc, _tt, _ct, _callers) in entries.values())
    print(f"{role} Python calls per job: {calls / jobs:.1f} ({calls:,} calls, {jobs:,} jobs)")
    for title, key in (("calls", 1), ("own time", 2)):
        rows = sorted(entries.items(), key=lambda kv: kv[1][key], reverse=True)[:top]
        print(f"\nBy {title}:\n| calls/job | own µs/job | with callees µs/job | function |")
        print("|---:|---:|---:|---|")
        for (path, line, name), (_cc, nc, tt, ct, _callers) in rows:
            where = f"{Path(path).name}:{line}" if path != "~" else "C"
            print(f"| {nc / jobs:.2f} | {tt * 1e6 / jobs:.2f} | {ct * 1e6 / jobs:.2f} "
                  f"| {name} ({where}) |")  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.writer_prof", description=__doc__)
    parser.add_argument("--scenario", default="ppa", choices=("ppa", *ALL_SCENARIOS))
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--role", default="writer", help="writer, shard0, shard1 or frontend")
    parser.add_argument("--executable", default=str(Path(sys.executable).parent / "shardq"))
    args = parser.parse_args(argv)
    if args.profile:
        with tempfile.TemporaryDirectory(prefix="writer-prof-stats-") as prof_dir:
            us, done, stats = run_once(
                args.executable, args.scenario, args.jobs, args.shards, prof_dir, args.role
            )
            assert stats is not None
            print(f"{args.scenario}: {done:,} jobs, {args.role} {us:.1f} µs/job (profiled)")
            _report(stats, done, args.top, args.role)
        return 0
    results = []
    for _ in range(args.rounds):
        us, done, _ = run_once(
            args.executable, args.scenario, args.jobs, args.shards, None, args.role
        )
        results.append(us)
        print(f"{args.scenario}: {done:,} jobs, {args.role} {us:.1f} µs/job", flush=True)
    print(f"median {args.role} µs/job: {statistics.median(results):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
