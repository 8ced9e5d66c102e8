"""Stops a throwaway PostgreSQL server (`bench._pg_server`) whose owner died without stopping it.

    python bench/_pg_watch.py OWNER_PID ROOT POSTMASTER_PID

`PostgresServer.start` runs this as a process of its own session. A test run or benchmark killed
with SIGKILL never runs its `stop`, and its postmaster would otherwise keep running (and keep its
port, memory and temporary directory) until someone stops it by hand. This polls every half
second: once ROOT is gone the server was stopped the ordinary way and it exits; once OWNER_PID is
gone it sends the postmaster SIGQUIT (PostgreSQL's immediate shutdown), waits up to 10 s for it
to end, and deletes ROOT. It runs as a plain script (no imports from the repository), so it
needs no package path.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

_POLL_S = 0.5
_SHUTDOWN_WAIT_S = 10.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process (the postgres user's): it exists
        return True
    return True


def watch(owner: int, root: str, postmaster: int) -> None:
    """Return when `root` is gone; stop `postmaster` and delete `root` if `owner` goes first."""
    while os.path.isdir(root):
        if not _alive(owner):
            _stop(postmaster)
            shutil.rmtree(root, ignore_errors=True)
            return
        time.sleep(_POLL_S)


def _stop(postmaster: int) -> None:
    try:
        os.kill(postmaster, signal.SIGQUIT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + _SHUTDOWN_WAIT_S
    while _alive(postmaster) and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
