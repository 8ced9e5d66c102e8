"""A queue whose tasks are all sync runs them in the SDK worker's own threads
(`SyncDispatcher`): results, counts and calls of async tasks sent there stay as before."""

from __future__ import annotations

import asyncio
import cProfile
import logging
import pstats
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sample_tasks
import structlog
from shardq_harness import ShardqServer
from task_helpers import WorkerProcess

from shardq.client import Job
from shardq.core import Engine
from shardq.tasks._dispatch import Dispatcher, SyncDispatcher

JOBS = 300


def test_sync_queue_runs_every_job_once_and_counts_it(
    tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    # A server of its own: the final count must not include another test's leftovers.
    with ShardqServer(tmp_path / "data").start() as server:
        host, port = server.tcp_address
        url = f"tcp://{host}:{port}"
        sample_tasks.app.close()
        sample_tasks.app.url = url
        try:
            worker = start_worker(url, "--queues", "default", "--concurrency", "8")
            sums = sample_tasks.add.map([(i, 1) for i in range(JOBS)])
            # An async task sent to the sync queue is handed to the loop and still runs.
            product = sample_tasks.multiply.apply((6, 7), queue="default")
            assert [r.get(timeout=30) for r in sums] == [i + 1 for i in range(JOBS)]
            assert product.get(timeout=15) == 42
            assert worker.stop(signal.SIGTERM) == 0, worker.tail()
        finally:
            sample_tasks.app.close()
        done = [line for line in worker.logs() if line.get("event") == "task done"]
        assert len(done) == JOBS + 1
        assert len({line["job_id"] for line in done}) == JOBS + 1
        (stopped,) = [line for line in worker.logs() if line.get("event") == "worker stopped"]
        # Eight threads update the counters: none of their increments is lost.
        assert (stopped["done"], stopped["failed"]) == (JOBS + 1, 0)


def test_with_info_logs_off_jobs_still_run_and_log_nothing_each(tmp_path: Path) -> None:
    with ShardqServer(tmp_path / "data").start() as server:
        host, port = server.tcp_address
        url = f"tcp://{host}:{port}"
        sample_tasks.app.close()
        sample_tasks.app.url = url
        log = tmp_path / "worker.log"
        # Not `start_worker`: it waits for the "worker starting" line, an info one.
        worker = WorkerProcess(url, log, "--queues", "default", "--log-level", "warning")
        try:
            sums = sample_tasks.add.map([(i, 2) for i in range(50)])
            assert [r.get(timeout=30) for r in sums] == [i + 2 for i in range(50)]
            assert worker.stop(signal.SIGTERM) == 0, worker.tail()
        finally:
            sample_tasks.app.close()
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait()
        assert worker.logs() == []  # nothing at warning or above, no line per job


def _pulled_task_job() -> Job:
    """A task call's job as a worker gets it: pushed and pulled on a real engine."""
    engine = Engine(seed=1)
    now = 1_700_000_000_000
    push = {"cmd": "PUSH", "queue": "q", "name": sample_tasks.add.name, "stackTraceLimit": 50,
            "data": {"args": [2, 3], "kwargs": {}}}  # fmt: skip
    assert engine.apply(push, now).reply["ok"]
    reply = engine.apply({"cmd": "PULL", "queue": "q", "owner": "w"}, now + 1).reply
    return Job.from_wire(reply["job"])


def test_a_dispatch_does_no_logging_work_when_info_is_off() -> None:
    """Per job, a sync dispatch with info logs off makes no logger call and builds none of
    its arguments (the call with its duration once cost as much as the rest of it)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    loop = asyncio.new_event_loop()
    try:
        counters = [0, 0]
        tasks: Any = sample_tasks.app.tasks
        on_loop = Dispatcher(tasks, None, counters)  # type: ignore[arg-type]
        dispatch = SyncDispatcher(tasks, counters, on_loop, loop)
        job = _pulled_task_job()
        assert dispatch(job) == 5
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(100):
            dispatch(job)
        profile.disable()
    finally:
        loop.close()
        structlog.reset_defaults()
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    calls = {name: row[1] / 100 for (_file, _line, name), row in stats.items()}
    # A filtered-out level is structlog's `_nop`: still a call, with its arguments built.
    unwanted = ("_nop", "info", "round", "__instancecheck__", "genexpr")
    assert not [name for name in calls if any(word in name for word in unwanted)], calls
    assert calls["<built-in method time.perf_counter>"] == 1  # the start, for a failure's log
    assert counters == [101, 0]
    # the dispatch, the task, decode_payload, _inputs, the counters' add and its lock, gets
    assert sum(calls.values()) <= 10, calls
