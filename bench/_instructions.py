"""Instructions per job of each server process, counted by valgrind (cachegrind).

`python -m bench.cpu_ab --instructions` uses this instead of CPU time. CPU time on a shared VM
moves by 10-20 % between two runs of the same build, with what else the machine runs. An
instruction count does not depend on other load, but it still depends on how the processes'
batches form, which timing decides. Two runs of one build with 5,000 jobs (BENCHMARKS.md §7)
differed by at most 4 % in the front end, but by 2-44 % in the shards and 3-35 % in the writer
(its group commits). Compare per process, and repeat a build to see the spread. It says
nothing about cache misses, system calls or waits: it ranks builds by the work they do, and the
CPU-time mode stays the measure of speed.

Every process of the server runs under cachegrind with its cache simulation off, which only
counts instructions (`--trace-children=yes`), about 25 times slower than native. Startup,
recovery and shutdown would swamp the count, so each scenario runs twice on fresh servers, one
after the other, with N and with 2N jobs, and the count per job is the difference divided by
N (the warm-up pushes are the same in both runs and the fill of a drain scales with N: for a
drain the count is that of the fill by PUSHB and the drain together). What the server does
while idle (its timers) scales with the time a run takes, and counts in the difference.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._scenarios import children, connect, fill, queues_of, start_server, work

__all__ = ["have_valgrind", "measure_instructions", "read_totals", "valgrind_wrapper"]

# Under valgrind a Python process starts in seconds, not milliseconds.
_CONNECT_TIMEOUT_S = 600
_STOP_TIMEOUT_S = 600
_TOTALS = re.compile(rb"^summary: (\d+)", re.M)


def have_valgrind() -> bool:
    return shutil.which("valgrind") is not None


def valgrind_wrapper(out_dir: Path) -> list[str]:
    """The command prefix that counts the instructions of a process and of every process it
    starts; each writes its count to `out_dir/ir.<pid>` when it exits."""
    return ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--trace-children=yes",
            f"--cachegrind-out-file={out_dir}/ir.%p"]  # fmt: skip


def read_totals(path: Path) -> int:
    """The instruction count a cachegrind output file reports for its whole run."""
    match = _TOTALS.search(path.read_bytes())
    if match is None:
        raise ValueError(f"{path}: no instruction count (did the process exit cleanly?)")
    return int(match.group(1))


def _counted_run(executable: str, scenario: str, jobs: int, shards: int) -> dict[str, int]:
    """One run under valgrind: instructions by process role over the server's whole life."""
    with tempfile.TemporaryDirectory(prefix="cpu-ab-vg-") as data_dir:
        wrapper = valgrind_wrapper(Path(data_dir))
        # A child that starts this slowly would be killed as stuck (a build without the
        # setting has a fixed 30 s, which a loaded machine can meet under valgrind).
        # Likewise a stop: a child still stopping past shutdown_timeout_ms (and the
        # supervisor's grace) is SIGKILLed and leaves no count.
        slow = {
            "SHARDQ_READY_TIMEOUT_MS": str(_CONNECT_TIMEOUT_S * 1000),
            "SHARDQ_SHUTDOWN_TIMEOUT_MS": str(_STOP_TIMEOUT_S * 1000 // 2),
        }
        server, port = start_server(executable, shards, data_dir, wrapper=wrapper, env=slow)
        try:
            conn = connect(port, server, timeout_s=_CONNECT_TIMEOUT_S)
            procs = children(server.pid)
            queues = queues_of(scenario)
            fill(conn, scenario, queues, jobs)
            work(conn, scenario, queues, jobs)
            time.sleep(2.0)  # the writer commits what the run left
            conn.close()
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                server.kill()
                raise
        return {role: read_totals(Path(data_dir) / f"ir.{pid}") for pid, role in procs}


def measure_instructions(executable: str, scenario: str, jobs: int, shards: int) -> dict[str, Any]:
    """Instructions per job by process role: the runs with 2N and N jobs, differenced."""
    # One after the other: two servers at once under valgrind slow each other down, and
    # the idle work of each (its timers) then counts for more per job.
    small = _counted_run(executable, scenario, jobs, shards)
    large = _counted_run(executable, scenario, 2 * jobs, shards)
    return {"ir_per_job": {role: (large[role] - small[role]) / jobs for role in small}}
