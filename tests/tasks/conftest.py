"""Fixtures for the task API tests: one real server for the directory, and `shardq worker` runs.

The server is the runtime tests' `ShardqServer` harness; the worker is the real CLI,
started as a subprocess with its logs in a file.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).resolve().parent
_RUNTIME = _HERE.parent / "runtime"
if str(_RUNTIME) not in sys.path:
    sys.path.insert(0, str(_RUNTIME))

from shardq_harness import ShardqServer  # noqa: E402
from task_helpers import WorkerProcess  # noqa: E402


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    with ShardqServer(tmp_path_factory.mktemp("tasks") / "data", shards=2).start() as srv:
        yield srv
        assert srv.stop() == 0, srv.log_tail()


@pytest.fixture(scope="session")
def url(server: ShardqServer) -> str:
    host, port = server.tcp_address
    return f"tcp://{host}:{port}"


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
