"""Two builds of shardq side by side, by the CPU time each server process spends per job.

    python -m bench.cpu_ab --build base=/path/to/old/venv/bin/shardq --build new=shardq
                           [--scenario push1q,push8q,drain1q,drain8q] [--jobs 30000]
                           [--rounds 3] [--shards 2] [--instructions]

With `--instructions` each build runs each scenario once under valgrind, and the
table gives the instructions each process executes per job instead (`bench/_instructions.py`).

For each round, each build in turn starts a real `shardq start` on free ports with a fresh data
directory, and one raw TCP client runs the scenario: `push*` sends N PUSH pipelined 100 at a
time, `drain*` first fills the queues with PUSHB (not measured) and then takes everything with
PULLB 100 + ACKB on every queue at once. `*8q` spreads the jobs over 8 queues. Run only
when named: `ppa1q` (push, pull and ack all measured, in rounds of 2,000 jobs) and the `_roc`
variants `drain1q_roc`, `drain8q_roc`, `ppa1q_roc` (every job pushed with
`removeOnComplete`), and `dpush1q` (N durable PUSH one at a time, each waiting for its reply:
one commit per job, issue 24; run it with `SHARDQ_SPIN_US=0`, or spins count as work), and
`spush1q` (the same without `durable`: the single push's own turn in each process). The
CPU time of each child process (user + system, from /proc) is read before and after and
divided by N.

Why this and not `bench compare`: on a shared VM the wall-clock rate of the same build moves
by 2x within an hour, so two `compare` runs one after the other cannot resolve a 10 %
difference. CPU time per job moves much less, and alternating the builds round by round puts
both under the same conditions; it still moves by 10-20 % from one round to the next. A
difference of a few per cent in one process shows better in `--instructions`, whose counts do
not depend on other load; the front end's repeat within 4 %, the shards' and the writer's
vary far more with how their batches form.
After the rounds a summary gives, per scenario and per build after the first, the median
total against the first build's median, the same ratio round by round (paired: the two runs of
one round ran side by side), and the noise: how far the first build's own rounds spread
((max - min) / median). "slower beyond the noise" is printed where the median ratio exceeds
1 + noise and at least two thirds of the paired rounds are slower.
Linux only (/proc). The children are told apart by their command line (a child restarted
mid-run still counts for its own role); the HTTP port is turned off where the build has one,
so both builds run the same processes.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

from bench._instructions import have_valgrind, measure_instructions
from bench._scenarios import (
    ALL_SCENARIOS,
    SCENARIOS,
    children,
    connect,
    fill,
    queues_of,
    start_server,
    work,
)
from bench.cpu import cpu_seconds


def measure(executable: str, scenario: str, jobs: int, shards: int) -> dict[str, Any]:
    """One run of `scenario` on a fresh server: CPU µs per job by process, and jobs/s."""
    with tempfile.TemporaryDirectory(prefix="cpu-ab-") as data_dir:
        server, port = start_server(executable, shards, data_dir)
        try:
            conn = connect(port, server)
            queues = queues_of(scenario)
            fill(conn, scenario, queues, jobs)
            time.sleep(1.0)  # the writer commits the fill
            procs = children(server.pid)
            before = {pid: cpu_seconds(pid) for pid, _ in procs}
            started = time.perf_counter()
            done = work(conn, scenario, queues, jobs)
            elapsed = time.perf_counter() - started
            time.sleep(0.5)  # the writer commits what the run left
            after = {pid: cpu_seconds(pid) for pid, _ in procs}
            conn.close()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    us = {role: (after[pid] - before[pid]) * 1e6 / done for pid, role in procs}
    return {"jobs_per_s": done / elapsed, "us_per_job": us}


def _line(scenario: str, name: str, result: dict[str, Any]) -> str:
    us: dict[str, float] = result["us_per_job"]
    shards = sum(v for k, v in us.items() if k.startswith("shard"))
    return (
        f"| {scenario} | {name} | {result['jobs_per_s']:,.0f} | {us['frontend']:.1f} | "
        f"{shards:.1f} | {us['writer']:.1f} | {sum(us.values()):.1f} |"
    )


def _count_instructions(
    builds: list[tuple[str, ...]], scenarios: list[str], jobs: int, shards: int
) -> None:
    print("| scenario | build | front end kIr/job | shards kIr/job | writer kIr/job | "
          "total kIr/job | total against the first build |\n|---|---|---:|---:|---:|---:|---:|",
          flush=True)  # fmt: skip
    for scenario in scenarios:
        first = 0.0
        for name, executable in builds:
            ir = measure_instructions(executable, scenario, jobs, shards)["ir_per_job"]
            shard_ir = sum(v for k, v in ir.items() if k.startswith("shard"))
            total = sum(ir.values())
            first = first or total
            change = 100 * (total / first - 1)
            print(
                f"| {scenario} | {name} | {ir['frontend'] / 1e3:.1f} | {shard_ir / 1e3:.1f} | "
                f"{ir['writer'] / 1e3:.1f} | {total / 1e3:.1f} | {change:+.1f} % |",
                flush=True,
            )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_ab", description=__doc__)
    parser.add_argument(
        "--build",
        action="append",
        required=True,
        metavar="NAME=SHARDQ",
        help="a name and the `shardq` executable of a build (twice or more)",
    )
    parser.add_argument("--scenario", default=",".join(SCENARIOS))
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shards", type=int, default=2)  # fmt: skip
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per job under valgrind (one round)",
    )
    args = parser.parse_args(argv)
    builds = [tuple(b.split("=", 1)) for b in args.build]
    if any(len(b) != 2 for b in builds) or os.name != "posix":
        parser.error("--build takes NAME=PATH; Linux only")
    # A relative path (`.venv/bin/shardq`) is this directory's: the servers start elsewhere.
    builds = [(name, os.path.abspath(path) if os.sep in path else path) for name, path in builds]
    scenarios = args.scenario.split(",")
    if unknown := set(scenarios) - set(ALL_SCENARIOS):
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    if args.instructions:
        if not have_valgrind():
            parser.error("--instructions needs valgrind (apt-get install valgrind)")
        _count_instructions(builds, scenarios, args.jobs, args.shards)
        return 0
    print("| scenario | build | jobs/s | front end µs/job | shards µs/job | writer µs/job | "
          "total µs/job |\n|---|---|---:|---:|---:|---:|---:|", flush=True)  # fmt: skip
    totals: dict[tuple[str, str], list[float]] = {}
    for scenario in scenarios:
        for _ in range(args.rounds):
            for name, executable in builds:
                result = measure(executable, scenario, args.jobs, args.shards)
                print(_line(scenario, name, result), flush=True)
                totals.setdefault((scenario, name), []).append(sum(result["us_per_job"].values()))
    print(_summary(scenarios, [name for name, _ in builds], totals))
    return 0


def _summary(
    scenarios: list[str], names: list[str], totals: dict[tuple[str, str], list[float]]
) -> str:
    """Each later build's total µs/job against the first's, with the first's own spread."""
    lines = [
        "",
        f"| scenario | build | median total µs/job | against {names[0]} | paired rounds | "
        f"noise of {names[0]} | verdict |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for scenario in scenarios:
        first = totals[(scenario, names[0])]
        base = statistics.median(first)
        noise = (max(first) - min(first)) / base if base else 0.0
        for name in names[1:]:
            runs = totals[(scenario, name)]
            ratio = statistics.median(runs) / base if base else 0.0
            paired = [r / f for r, f in zip(runs, first, strict=True) if f]
            slower = sum(p > 1 for p in paired)
            beyond = ratio > 1 + noise and slower * 3 >= len(paired) * 2
            verdict = "slower beyond the noise" if beyond else "within the noise or faster"
            rounds = " ".join(f"{p:.2f}" for p in paired)
            lines.append(
                f"| {scenario} | {name} | {statistics.median(runs):.1f} | {ratio:.2f} | "
                f"{rounds} | ±{noise:.0%} | {verdict} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
