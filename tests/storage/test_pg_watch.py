"""A throwaway PostgreSQL server whose owner dies by SIGKILL is stopped by its watcher
(`bench/_pg_watch.py`), and an ordinary `stop` ends the watcher with it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

NEEDS_POSTGRES = True

_REPO = Path(__file__).resolve().parents[2]
_OWNER = """
import sys, time
from bench._pg_server import PostgresServer
server = PostgresServer().start()
pid = (server.data / "postmaster.pid").read_text().split()[0]
print(server.root, pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pid: int, root: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid) and not root.exists():
            return True
        time.sleep(0.1)
    return False


def test_a_killed_owner_leaves_no_server_behind() -> None:
    env = {**os.environ, "PYTHONPATH": str(_REPO)}
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True, env=env, cwd=_REPO
    )
    assert owner.stdout is not None
    root_text, pid_text = owner.stdout.readline().split()
    root, postmaster = Path(root_text), int(pid_text)
    try:
        assert _alive(postmaster) and root.is_dir()
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        assert _wait_gone(postmaster, root, timeout_s=30), "the postmaster outlived its owner"
    finally:
        if _alive(postmaster):  # the watcher failed: stop what this test started
            os.kill(postmaster, signal.SIGQUIT)
        shutil.rmtree(root, ignore_errors=True)


def test_stop_ends_the_watcher() -> None:
    sys.path.insert(0, str(_REPO))
    from bench._pg_server import PostgresServer

    server = PostgresServer().start()
    try:
        watcher = server._watcher
        assert watcher is not None and watcher.poll() is None
    finally:
        server.stop()
    assert watcher.poll() is not None
    assert not server.root.exists()
