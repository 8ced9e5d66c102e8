"""Cancelling a running task: the server fails it at once and pushes the cancel to the
`shardq worker` that runs it; the handler sees `current_job().cancelled` within a second (an
async one is cancelled), and the job is not retried."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flow_tasks import spin, spin_async
from task_helpers import HERE, WorkerProcess, running_flow_worker

from shardq import TaskFailed
from shardq.client import Connection, Queue, ServerError

SEEN_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def cancel_worker(url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    log = tmp_path_factory.mktemp("cancel") / "worker.log"
    args = ("--queues", "cancel,cancel-async", "--concurrency", "2", "--grace", "5")
    with running_flow_worker(url, log, *args) as proc:
        yield proc


def _lines(path: Path, prefix: str, count: int = 1, timeout: float = 15.0) -> list[list[str]]:
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        found = [line.split(" ", 3) for line in lines if line.startswith(prefix)]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"no {prefix!r} in {lines}"
        time.sleep(0.01)


def _check_dead(url: str, queue: str, job_id: str, reason: str) -> None:
    with Queue(queue, url=url) as q:
        job = q.get_job(job_id)
        assert job is not None and job.state == "failed", job
        assert job.failed_reason == reason
        assert job.attempts <= 1, "a cancelled job is not retried"
        assert [e.reason for e in q.dlq() if e.job.id == job_id] == ["cancelled"]


def test_cancel_a_running_sync_task(cancel_worker: WorkerProcess, url: str, tmp_path: Path) -> None:
    log = tmp_path / "spin.log"
    result = spin.delay(str(log), 30.0)
    _lines(log, "started")
    asked = time.time()
    assert result.cancel("no longer needed") is True
    (_, seen, reason) = _lines(log, "cancelled")[0][:3]
    assert float(seen) - asked < SEEN_WITHIN_S, float(seen) - asked
    assert reason == "cancelled:"  # the reason's first word; the whole one is below
    with pytest.raises(TaskFailed) as info:
        result.get(timeout=10)
    assert info.value.reason == "cancelled: no longer needed"
    _check_dead(url, "cancel", result.id, "cancelled: no longer needed")
    time.sleep(1.0)  # a retry would start within the backoff (1 s by default)
    assert len(_lines(log, "started")) == 1 and "finished" not in log.read_text()
    # The worker goes on: the next job runs to its end.
    again = spin.delay(str(tmp_path / "again.log"), 0.0)
    assert again.get(timeout=10) == "finished"


def test_cancel_a_running_async_task(
    cancel_worker: WorkerProcess, url: str, tmp_path: Path
) -> None:
    log = tmp_path / "spin.log"
    result = spin_async.delay(str(log), 30.0)
    _lines(log, "started")
    asked = time.time()
    with Queue("cancel-async", url=url) as queue:
        assert queue.cancel(result.id) is True
        assert queue.cancel(result.id) is False  # nothing left to cancel
    (_, seen, flag) = _lines(log, "cancelled")[0][:3]
    assert float(seen) - asked < SEEN_WITHIN_S, float(seen) - asked
    assert flag == "True"  # current_job().cancelled, inside the task's CancelledError
    with pytest.raises(TaskFailed, match="cancelled"):
        result.get(timeout=10)
    _check_dead(url, "cancel-async", result.id, "cancelled")
    time.sleep(1.0)
    assert len(_lines(log, "started")) == 1 and "finished" not in log.read_text()
    assert spin_async.delay(str(tmp_path / "again.log"), 0.0).get(timeout=10) == "finished"
    logged = [line for line in cancel_worker.logs() if line.get("event") == "job cancelled"]
    assert any(line.get("job_id") == result.id for line in logged), logged


def test_cli_cancels_a_running_job(cancel_worker: WorkerProcess, url: str, tmp_path: Path) -> None:
    log = tmp_path / "spin.log"
    result = spin.delay(str(log), 30.0)
    _lines(log, "started")
    argv = [sys.executable, "-m", "shardq_cli.main", "job", "cancel", result.id,
            "--reason", "from the CLI", "--url", url]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "it was running" in done.stdout, done.stdout
    _lines(log, "cancelled")
    with pytest.raises(TaskFailed, match="cancelled: from the CLI"):
        result.get(timeout=10)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert again.returncode == 1 and "not cancelled" in again.stderr, again


def test_bunqueue_cancel_is_unchanged(url: str) -> None:
    """Without `active`, Cancel removes a queued job and refuses an active one, as bunqueue's."""
    with Connection(url) as conn:
        queued = conn.call({"cmd": "PUSH", "queue": "cancel-compat", "data": {}})["id"]
        assert conn.call({"cmd": "Cancel", "id": queued})["ok"] is True
        assert conn.call({"cmd": "GetState", "id": queued})["state"] == "unknown"
        conn.call({"cmd": "PUSH", "queue": "cancel-compat", "data": {}})
        pull = {"cmd": "PULL", "queue": "cancel-compat", "owner": "w", "lockTtl": 30_000}
        pulled = conn.call(pull)
        with pytest.raises(ServerError, match="Job not found or cannot be cancelled"):
            conn.call({"cmd": "Cancel", "id": pulled["job"]["id"]})
        assert conn.call({"cmd": "GetState", "id": pulled["job"]["id"]})["state"] == "active"
