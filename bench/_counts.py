"""Counts per request of a running server's processes that do not depend on the machine's load:
system calls by name (`strace -f -c` attached to each process) and Python function calls
(cProfile, through `bench/_prof`). `python -m bench.durable_hops --counts` uses them.

With `spin_us = 0` both are the same from one run to the next: every process sleeps in its
poll until a message comes, so a wait is one poll call whatever else the machine runs. With
spinning on, the polls of a spin (and its `sched_yield` calls) are counted too, and how many
there are depends on the load.

The servers must be started with `profile_env(dir)` in their environment for the Python calls:
it puts `bench/_prof` on `PYTHONPATH`, whose `sitecustomize` makes every process profile itself
between SIGUSR1 and SIGUSR2 and write `<dir>/<pid>.prof`.
"""

from __future__ import annotations

import os
import pstats
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["have_strace", "measure_counts", "profile_env"]

_PROF = Path(__file__).resolve().parent / "_prof"
# How long strace takes to attach to every thread of a process before the requests start, and
# how long a profiled process gets to write its profile after SIGUSR2.
_ATTACH_S = 1.0
_DUMP_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 30.0


def have_strace() -> bool:
    return shutil.which("strace") is not None


def profile_env(directory: Path) -> dict[str, str]:
    """The environment a server needs for its processes' Python calls to be counted."""
    path = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": f"{_PROF}{os.pathsep}{path}" if path else str(_PROF),
        "SHARDQ_PROF_DIR": str(directory),
    }


def _strace_totals(path: Path) -> dict[str, int]:
    """Calls by syscall name from an `strace -c` summary (the `total` row left out)."""
    calls: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        # "% time  seconds  usecs/call  calls  [errors]  syscall"
        if len(parts) < 5 or not parts[0][0].isdigit() or parts[-1] == "total":
            continue
        calls[parts[-1]] = calls.get(parts[-1], 0) + int(parts[3])
    return calls


def _python_calls(path: Path) -> int | None:
    """The function calls a profile counted; None if it was not written (whole) in time."""
    deadline = time.monotonic() + _DUMP_TIMEOUT_S
    while True:
        try:
            stats = pstats.Stats(str(path))
        except (OSError, EOFError, ValueError, TypeError):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)  # not there yet, or still being written
            continue
        return sum(entry[1] for entry in stats.stats.values())  # type: ignore[attr-defined]


def measure_counts(
    processes: Sequence[tuple[str, int]],
    work_dir: Path,
    run: Callable[[], int],
    profile: bool = True,
) -> dict[str, Any]:
    """Run `run` (it returns how many requests it made) with every process of `processes`
    ((role, pid)) under strace and, with `profile`, profiled (the server started with
    `profile_env(work_dir)`); per role, shards summed: the system calls per request
    (`<role>_syscalls`, and by name `<role>_sys` where at least 0.05) and the Python function
    calls per request (`<role>_pycalls`)."""
    # The profiles start before strace attaches and stop after it has detached: a signal that
    # comes while strace detaches from a process can be lost (a profile then never stopped).
    _signal_all(processes, signal.SIGUSR1, profile)
    tracers = []
    for role, pid in processes:
        path = work_dir / f"strace-{role}-{pid}.txt"
        tracer = subprocess.Popen(
            ["strace", "-f", "-c", "-o", str(path), "-p", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        tracers.append((role, path, tracer))
    time.sleep(_ATTACH_S)
    try:
        requests = run()
    finally:
        for _, _, tracer in tracers:
            tracer.send_signal(signal.SIGINT)  # our own strace: it detaches and summarises
        for _, _, tracer in tracers:
            tracer.wait(_STOP_TIMEOUT_S)
        _signal_all(processes, signal.SIGUSR2, profile)
    row = _syscalls_row([(role, path) for role, path, _ in tracers], requests)
    if profile:
        row.update(_pycalls_row(processes, work_dir, requests))
    return row


def _signal_all(processes: Sequence[tuple[str, int]], signum: int, profile: bool) -> None:
    if profile:
        for _, pid in processes:
            os.kill(pid, signum)


def _syscalls_row(summaries: Sequence[tuple[str, Path]], requests: int) -> dict[str, Any]:
    by_role: dict[str, dict[str, int]] = {}
    for role, path in summaries:
        into = by_role.setdefault(role, {})
        for name, calls in _strace_totals(path).items():
            into[name] = into.get(name, 0) + calls
    row: dict[str, Any] = {}
    for role, names in by_role.items():
        row[f"{role}_syscalls"] = round(sum(names.values()) / requests, 2)
        row[f"{role}_sys"] = {
            name: round(n / requests, 2)
            for name, n in sorted(names.items(), key=lambda kv: -kv[1])
            if n / requests >= 0.05
        }
    return row


def _pycalls_row(
    processes: Sequence[tuple[str, int]], work_dir: Path, requests: int
) -> dict[str, Any]:
    by_role: dict[str, int] = {}
    for role, pid in processes:
        path = work_dir / f"{pid}.prof"
        calls = _python_calls(path)
        if calls is not None:
            by_role[role] = by_role.get(role, 0) + calls
            path.unlink()
    return {f"{role}_pycalls": round(calls / requests, 1) for role, calls in by_role.items()}
