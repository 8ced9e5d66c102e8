"""Fixtures for the task API tests: one real server for the directory, and `shardq worker` runs.

The server is the runtime tests' `ShardqServer` harness; the worker is the real CLI,
started as a subprocess with its logs in a file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).resolve().parent
_RUNTIME = _HERE.parent / "runtime"
if str(_RUNTIME) not in sys.path:
    sys.path.insert(0, str(_RUNTIME))

from shardq_harness import ShardqServer  # noqa: E402

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    with ShardqServer(tmp_path_factory.mktemp("tasks") / "data", shards=2).start() as srv:
        yield srv
        assert srv.stop() == 0, srv.log_tail()


@pytest.fixture(scope="session")
def url(server: ShardqServer) -> str:
    host, port = server.tcp_address
    return f"tcp://{host}:{port}"


class WorkerProcess:
    """`shardq worker sample_tasks:app ...` as a subprocess, logging to `log_path`."""

    def __init__(self, url: str, log_path: Path, *args: str) -> None:
        self.log_path = log_path
        argv = [sys.executable, "-m", "shardq_cli.main", "worker", "sample_tasks:app",
                "--url", url, *args]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(_HERE)}
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=_HERE, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
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


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """`start_worker(url, *flags)`: a running worker (ready once its "worker starting" line
    is out); killed at teardown if a test left it running."""
    started: list[WorkerProcess] = []

    def start(url: str, *args: str) -> WorkerProcess:
        worker = WorkerProcess(url, tmp_path / f"worker-{len(started)}.log", *args)
        started.append(worker)
        worker.wait_log("worker starting")
        return worker

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()


@pytest.fixture
def sample_app(url: str) -> Iterator[Any]:
    """`sample_tasks.app`, pointed at the test server for this test."""
    import sample_tasks

    sample_tasks.app.close()
    sample_tasks.app.url = url
    yield sample_tasks.app
    sample_tasks.app.close()
