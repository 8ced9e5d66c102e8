"""`.delay()`/`.get()` against a real server and `shardq worker sample_tasks:app
--processes 2` run as a subprocess: results, retries with backoff, remote tracebacks,
timeouts, unknown task names, and the worker's JSON logs."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sample_tasks
from shardq_harness import ShardqServer
from task_helpers import WorkerProcess, running_worker

from shardq import TaskFailed
from shardq.client import SerializationError, WaitTimeout


@pytest.fixture(scope="module")
def worker(url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with running_worker(url, log, "--processes", "2", "--concurrency", "4") as proc:
        yield proc


def test_sync_and_async_tasks_round_trip(worker: WorkerProcess, sample_app: Any) -> None:
    sums = [sample_tasks.add.delay(i, i) for i in range(20)]
    products = [sample_tasks.multiply.delay(i, 3) for i in range(20)]
    assert [r.get(timeout=15) for r in sums] == [2 * i for i in range(20)]
    assert [r.get(timeout=15) for r in products] == [3 * i for i in range(20)]
    assert sums[0].state() == "completed"
    # Keyword arguments and nested values arrive as sent (tuples as lists: msgpack).
    echoed = sample_tasks.echo.apply((1, "two"), {"three": [3, {"x": None}]}).get(timeout=15)
    assert echoed == {"args": [1, "two"], "kwargs": {"three": [3, {"x": None}]}}


def test_both_processes_serve(worker: WorkerProcess, sample_app: Any) -> None:
    roles = {line.get("role") for line in worker.wait_log("worker process ready", count=2)}
    assert roles == {"worker-0", "worker-1"}
    assert len({line["pid"] for line in worker.logs() if line.get("role") in roles}) == 2


def test_retries_with_backoff(worker: WorkerProcess, sample_app: Any, tmp_path: Path) -> None:
    log = tmp_path / "flaky.log"
    result = sample_tasks.flaky.delay(str(log), 2)
    assert result.get(timeout=20) == 3
    starts = [float(t) for t in log.read_text().split()]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # backoff=0.2: the server waits 0.2 * 2^attempt * (0.5..1.5) between attempts.
    assert len(starts) == 3 and all(gap >= 0.18 for gap in gaps), gaps


def test_failure_raises_task_failed_with_the_remote_traceback(
    worker: WorkerProcess, sample_app: Any
) -> None:
    result = sample_tasks.boom.delay("bad input 42")
    with pytest.raises(TaskFailed) as caught:
        result.get(timeout=15)
    failed = caught.value
    assert failed.job_id == result.id and failed.task == sample_tasks.boom.name
    assert failed.reason == "bad input 42"
    assert failed.exc_type == "ValueError"
    assert "in _explode" in failed.traceback and "sample_tasks.py" in failed.traceback
    assert "Remote traceback" in str(failed)
    assert result.state() == "failed"


def test_timeout_fails_the_task(worker: WorkerProcess, sample_app: Any) -> None:
    result = sample_tasks.too_slow.delay(5.0)
    with pytest.raises(TaskFailed, match=r"timed out after 300ms"):
        result.get(timeout=15)


def test_get_gives_up_after_its_timeout(worker: WorkerProcess, sample_app: Any) -> None:
    result = sample_tasks.too_slow.apply((0.2,), timeout=None, delay=5.0)  # delayed: not run
    with pytest.raises(WaitTimeout):
        result.get(timeout=0.3)
    assert result.cancel() is True
    assert result.state() == "unknown"


def test_unknown_task_name_goes_to_the_dlq(worker: WorkerProcess, sample_app: Any) -> None:
    queue = sample_app.queue("default")
    job_id = queue.add("no.such.task", {"args": [], "kwargs": {}})
    with pytest.raises(TaskFailed, match=r"no task named 'no\.such\.task'"):
        sample_app.result(job_id, "no.such.task").get(timeout=15)
    (entry,) = [e for e in queue.dlq() if e.job.id == job_id]
    reason = entry.error or entry.job.failed_reason or ""
    assert "no task named 'no.such.task' is registered" in reason
    assert "sample_tasks.add" in reason


def test_logs_name_task_job_attempt_and_duration(worker: WorkerProcess, sample_app: Any) -> None:
    result = sample_tasks.add.delay(40, 2)
    assert result.get(timeout=15) == 42
    (line,) = [line for line in worker.wait_log("task done") if line.get("job_id") == result.id]
    assert line["task"] == sample_tasks.add.name and line["attempt"] == 1
    assert isinstance(line["duration_ms"], float) and line["pid"] != os.getpid()


def test_unencodable_argument_refused_before_sending(sample_app: Any) -> None:
    before = sample_app.queue("default").counts()
    with pytest.raises(SerializationError, match=r"argument 1 cannot be sent \(object"):
        sample_tasks.add.delay(1, object())
    with pytest.raises(SerializationError, match="keyword argument 'b'"):
        sample_tasks.add.delay(1, b={1, 2})
    assert sample_app.queue("default").counts() == before


def test_unique_key_returns_the_queued_job(worker: WorkerProcess, sample_app: Any) -> None:
    first = sample_tasks.add.apply((1, 1), delay=5.0, unique_key="sum-once")
    second = sample_tasks.add.apply((2, 2), unique_key="sum-once")
    assert second.id == first.id
    assert first.cancel() is True


def test_map_enqueues_in_bulk(worker: WorkerProcess, sample_app: Any) -> None:
    results = sample_tasks.add.map((i, 10) for i in range(1500))  # two PUSHB chunks
    assert len({r.id for r in results}) == 1500
    assert [r.get(timeout=20) for r in results[::100]] == [i + 10 for i in range(0, 1500, 100)]
    assert results[-1].get(timeout=20) == 1509


def test_producing_over_zeromq(
    worker: WorkerProcess, sample_app: Any, server: ShardqServer
) -> None:
    sample_app.close()
    sample_app.url = f"zmq://127.0.0.1:{server.zmq_port}"
    results = [sample_tasks.multiply.delay(i, 2) for i in range(10)]
    assert [r.get(timeout=15) for r in results] == [2 * i for i in range(10)]
    assert results[0].state() == "completed"
