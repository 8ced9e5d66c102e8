"""`WorkerProcess`: `shardq worker sample_tasks:app` run as a subprocess by the tests.

A module of its own (not the conftest): every test directory has a module named "conftest".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

__all__ = ["HERE", "WorkerProcess", "running_flow_worker", "running_worker"]


class WorkerProcess:
    """`shardq worker sample_tasks:app ...` as a subprocess, logging to `log_path`."""

    def __init__(
        self,
        url: str,
        log_path: Path,
        *args: str,
        app: str = "sample_tasks:app",
        env: dict[str, str] | None = None,
    ) -> None:
        self.log_path = log_path
        argv = [sys.executable, "-m", "shardq_cli.main", "worker", app, "--url", url, *args]
        env = {**os.environ, **(env or {}), "PYTHONPATH": str(HERE)}
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=HERE, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )

    def logs(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def wait_log(self, event: str, count: int = 1, timeout: float = 15.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.logs() if line.get("event") == event]
            if len(found) >= count:
                return found
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no {count}x {event!r}:\n{self.tail()}"
            time.sleep(0.02)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the worker did not stop:\n{self.tail()}") from None

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-30:])


@contextmanager
def running_worker(
    url: str, log_path: Path, *args: str, app: str = "sample_tasks:app"
) -> Iterator[WorkerProcess]:
    """A started worker for a module's tests; it must stop cleanly on SIGTERM afterwards, and
    is killed if a test left it running."""
    proc = WorkerProcess(url, log_path, *args, app=app)
    try:
        proc.wait_log("worker starting")
        yield proc
        assert proc.stop(signal.SIGTERM) == 0, proc.tail()
    finally:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait()


@contextmanager
def running_flow_worker(url: str, log_path: Path, *args: str) -> Iterator[WorkerProcess]:
    """`running_worker` for `flow_tasks:app`, with the tests' own app pointed at `url` (its
    connection closed before and after, so no module inherits another's)."""
    import flow_tasks

    flow_tasks.app.close()
    flow_tasks.app.url = url
    try:
        with running_worker(url, log_path, *args, app="flow_tasks:app") as proc:
            yield proc
    finally:
        flow_tasks.app.close()
