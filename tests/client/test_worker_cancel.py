"""`queue.cancel` of a running job reaches the SDK worker that holds it, over TCP and ZeroMQ,
from the blocking and the asyncio client: `current_job().cancelled` turns true (a sync handler
waits on it), an async handler's task is cancelled, and the job is failed, not retried."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from client_helpers import Clients, wait_until

from shardq.client import Job, JobOptions, current_job

SEEN_WITHIN_S = 1.0


def _cancel_running(clients: Clients, handler: Any, seen: dict[str, float]) -> None:
    queue = clients.queue()
    job_id = queue.add("long", None, JobOptions(max_attempts=3))
    worker = clients.worker(queue.name, handler).start()
    wait_until(lambda: "started" in seen, what="the handler to start")
    asked = time.monotonic()
    assert queue.cancel(job_id, "enough") is True
    wait_until(lambda: "cancelled" in seen, what="the handler to see the cancel")
    assert seen["cancelled"] - asked < SEEN_WITHIN_S
    job = queue.get_job(job_id)
    assert (job.state, job.failed_reason) == ("failed", "cancelled: enough")
    assert queue.cancel(job_id) is False  # finished: nothing to cancel
    # The worker goes on with the next job, and never ran the cancelled one again.
    seen.clear()
    queue.add("short", None)
    wait_until(lambda: seen.get("done"), what="the next job")
    stats = worker.close(grace=5.0)
    assert stats.failed == 1 and stats.processed == 1, stats
    assert queue.get_job(job_id).attempts <= 1


def test_a_sync_handler_sees_cancelled(clients: Clients) -> None:
    seen: dict[str, float] = {}

    def handler(job: Job) -> str:
        if job.name == "short":
            seen["done"] = 1.0
            return "short"
        running = current_job()
        assert running.id == job.id and not running.cancelled
        seen["started"] = time.monotonic()
        if running.wait_cancelled(30):
            seen["cancelled"] = time.monotonic()
            assert running.reason == "cancelled: enough"
        return "ignored: the job already failed"

    _cancel_running(clients, handler, seen)


def test_an_async_handler_is_cancelled(clients: Clients) -> None:
    seen: dict[str, float] = {}

    async def handler(job: Job) -> str:
        if job.name == "short":
            seen["done"] = 1.0
            return "short"
        seen["started"] = time.monotonic()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            assert current_job().cancelled
            seen["cancelled"] = time.monotonic()
            raise
        return "slept"

    _cancel_running(clients, handler, seen)


def test_current_job_outside_a_handler() -> None:
    with pytest.raises(RuntimeError, match="outside a job handler"):
        current_job()
    box: list[BaseException] = []

    def other_thread() -> None:
        try:
            current_job()
        except RuntimeError as e:
            box.append(e)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert len(box) == 1
