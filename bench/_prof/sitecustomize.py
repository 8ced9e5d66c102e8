"""Profile a server's child process with cProfile, between two signals (`bench.writer_prof`).

Put this directory on PYTHONPATH and set SHARDQ_PROF_DIR: every Python process started with
that environment then profiles itself from SIGUSR1 to SIGUSR2, and writes what it counted to
`$SHARDQ_PROF_DIR/<pid>.prof` on SIGUSR2 (and at exit, if still profiling). Between the
signals, only the measured part of a run is counted: not the imports, the migration or the
fill of a drain. The handlers run in the main thread between two bytecodes, which is all a
profiler toggle needs; the processes' own signal handling (SIGTERM, SIGINT) is untouched.
"""

from __future__ import annotations

import atexit
import cProfile
import os
import signal
from types import FrameType

_DIR = os.environ.get("SHARDQ_PROF_DIR")


def _install(directory: str) -> None:
    profiler = cProfile.Profile()
    running = False

    def start(_signum: int, _frame: FrameType | None) -> None:
        nonlocal running, profiler
        if not running:
            running = True
            # A fresh count for every SIGUSR1: a second pair of signals (`bench.durable_hops
            # --counts`, one pair per mode) counts only what came between them.
            profiler = cProfile.Profile()
            profiler.enable()

    def stop(_signum: int = 0, _frame: FrameType | None = None) -> None:
        nonlocal running
        if running:
            profiler.disable()
            running = False
            profiler.dump_stats(os.path.join(directory, f"{os.getpid()}.prof"))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    atexit.register(stop)


if _DIR:
    _install(_DIR)
