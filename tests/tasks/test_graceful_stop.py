"""SIGTERM in the middle of a batch: the running tasks finish, the prefetched ones go back,
and a second worker finishes the rest: nothing lost, nothing that completed runs twice."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sample_tasks
from task_helpers import WorkerProcess

JOBS = 100  # 1.2 s of work for 4 slots: a SIGTERM after the first 8 lands mid-batch
TASK_S = 0.05  # long enough that SIGTERM lands while tasks run, short enough for a quick test


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _wait_running(started: Path, worker: WorkerProcess) -> None:
    """Until the task has begun: a job the server shows active may still wait in the worker's
    prefetch buffer, and a SIGTERM then gives it back and exits at once."""
    deadline = time.monotonic() + 10
    while not _lines(started):
        assert time.monotonic() < deadline, worker.tail()
        time.sleep(0.02)


def test_sigterm_mid_batch_loses_nothing_and_reruns_nothing(
    start_worker: Callable[..., WorkerProcess], sample_app: Any, url: str, tmp_path: Path
) -> None:
    log = tmp_path / "done.log"
    results = [sample_tasks.record.delay(str(log), f"job-{i}", TASK_S) for i in range(JOBS)]
    first = start_worker(url, "--processes", "2", "--concurrency", "2", "--queues", "batch")
    deadline = time.monotonic() + 15
    while len(_lines(log)) < 8:
        assert time.monotonic() < deadline, first.tail()
        time.sleep(0.01)
    assert first.stop(signal.SIGTERM) == 0, first.tail()
    done_by_first = _lines(log)
    # Stopped mid-batch: work was left, and the first worker held none of it any more.
    assert len(done_by_first) < JOBS
    counts = sample_app.queue("batch").counts()
    assert counts.active == 0 and counts.completed == len(done_by_first), counts

    second = start_worker(url, "--queues", "batch", "--concurrency", "4")
    assert [r.get(timeout=20) for r in results] == [f"job-{i}" for i in range(JOBS)]
    assert second.stop(signal.SIGTERM) == 0, second.tail()
    executed = _lines(log)
    assert sorted(executed) == sorted(f"job-{i}" for i in range(JOBS))  # each exactly once
    released = sum(line.get("released", 0) for line in first.wait_log("process stopped", 2))
    assert released > 0, "SIGTERM should have given prefetched jobs back"


def test_second_signal_stops_at_once(
    start_worker: Callable[..., WorkerProcess], sample_app: Any, url: str, tmp_path: Path
) -> None:
    log, running = tmp_path / "slow.log", tmp_path / "slow.started"
    sample_tasks.record.apply((str(log), "slow", 30.0, str(running)), queue="batch")
    worker = start_worker(url, "--queues", "batch", "--grace", "60")
    _wait_running(running, worker)
    started = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    worker.wait_log("stopping: finishing running jobs, giving prefetched ones back")
    assert worker.stop(signal.SIGTERM, timeout=10) == 1  # did not wait out the 30 s task
    assert time.monotonic() - started < 10
    assert worker.wait_log("second signal: stopping at once")
    sample_app.queue("batch").obliterate()


def test_a_sync_task_past_the_grace_is_given_back(
    start_worker: Callable[..., WorkerProcess], sample_app: Any, url: str, tmp_path: Path
) -> None:
    log, running = tmp_path / "overrun.log", tmp_path / "overrun.started"
    result = sample_tasks.record.apply((str(log), "overrun", 30.0, str(running)), queue="batch")
    worker = start_worker(url, "--queues", "batch", "--grace", "0.5")
    _wait_running(running, worker)
    started = time.monotonic()
    assert worker.stop(signal.SIGTERM, timeout=15) == 0, worker.tail()
    assert time.monotonic() - started < 10  # the thread still sleeping did not hold it
    assert result.state() == "waiting"  # released without using an attempt: runs again
    assert not _lines(log)
    assert result.cancel() is True
