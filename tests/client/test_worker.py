"""Workers against the real server, for each transport and client kind."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from client_helpers import Clients, wait_until

from shardq.client import DeadLettered, Job, JobOptions, UnrecoverableError


class Gauge:
    """Counts handlers running at once (thread-safe: sync handlers run in a pool)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.calls: list[str] = []

    def enter(self, job: Job) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.calls.append(job.id)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


@pytest.mark.parametrize("prefetch", [0, 5])
@pytest.mark.parametrize("handler_kind", ["sync_handler", "async_handler"])
def test_concurrency_and_the_prefetch_bound(
    clients: Clients, handler_kind: str, prefetch: int
) -> None:
    queue = clients.queue()
    ids = queue.add_bulk([("sq", i) for i in range(36)])
    gauge = Gauge()
    active_seen: list[int] = []

    def sync_handler(job: Job) -> int:
        gauge.enter(job)
        time.sleep(0.05)
        gauge.leave()
        return int(job.data) ** 2

    async def async_handler(job: Job) -> int:
        gauge.enter(job)
        await asyncio.sleep(0.05)
        gauge.leave()
        return int(job.data) ** 2

    handler = sync_handler if handler_kind == "sync_handler" else async_handler
    worker = clients.worker(queue.name, handler, concurrency=6, prefetch=prefetch).start()
    while queue.counts().completed < 36:
        active_seen.append(queue.counts().active)  # what the server has leased out
        time.sleep(0.01)
    stats = worker.close()

    assert stats.processed == 36 and stats.failed == 0 and stats.expired == 0
    assert gauge.peak == 6, "six handlers should run at once"
    assert max(active_seen) <= 6 + prefetch, "the worker leased more than concurrency + prefetch"
    if prefetch:
        assert max(active_seen) > 6, "jobs should be leased ahead of the free handlers"
    assert sorted(gauge.calls) == sorted(ids), "every job ran exactly once"
    assert queue.get_job(ids[5]).result == 25


def test_retries_then_success(clients: Clients) -> None:
    queue = clients.queue()
    job_id = queue.add("flaky", None, JobOptions(max_attempts=3, backoff_ms=10))
    calls: list[int] = []

    def handler(job: Job) -> str:
        calls.append(job.attempts)
        if len(calls) < 3:
            raise ConnectionError(f"attempt {len(calls)} failed")
        return "finally"

    stats = clients.worker(queue.name, handler).run_until_idle(timeout=15)
    assert calls == [0, 1, 2]
    assert (stats.processed, stats.failed) == (1, 2)
    job = queue.get_job(job_id)
    assert (job.state, job.result, job.attempts) == ("completed", "finally", 2)


def test_unrecoverable_error_goes_to_the_dlq(clients: Clients) -> None:
    queue = clients.queue()
    job_id = queue.add("bad", {"x": 1}, JobOptions(max_attempts=5))

    def handler(job: Job) -> None:
        raise UnrecoverableError("malformed payload")

    stats = clients.worker(queue.name, handler).run_until_idle(timeout=10)
    assert (stats.processed, stats.failed) == (0, 1)
    (entry,) = queue.dlq()
    assert (entry.job.id, entry.reason, entry.error) == (
        job_id,
        "explicit_fail",
        "malformed payload",
    )
    job = queue.get_job(job_id)
    assert (job.state, job.attempts) == ("failed", 1)
    assert job.stacktrace and "UnrecoverableError: malformed payload" in job.stacktrace[-1]
    with pytest.raises(DeadLettered):
        queue.join(timeout=5)


def test_heartbeats_keep_a_job_past_its_lock_ttl(clients: Clients) -> None:
    kept = clients.queue()
    lapsed = clients.queue()
    kept_id = kept.add("long", None)
    lapsed_id = lapsed.add("long", None)
    calls: dict[str, int] = {}

    def slow(job: Job) -> str:
        calls[job.id] = calls.get(job.id, 0) + 1
        time.sleep(1.2)  # > 3 lock TTLs
        return "done"

    ttl = {"lock_ttl_ms": 400, "concurrency": 1}
    beating = clients.worker(kept.name, slow, **ttl).start()  # renews every ttl/3
    # No prefetch for the control: a prefetching worker would pull the lapsed job back into
    # its own buffer, so its late ACK (the point of the control) would meet a newer lease.
    silent = clients.worker(lapsed.name, slow, heartbeat_interval=30.0, prefetch=0, **ttl).start()
    wait_until(lambda: kept.counts().completed == 1, 10, "the heartbeated job")
    wait_until(lambda: lapsed.counts().completed == 1, 10, "the control job")
    beating.close()
    silent.close()

    job = kept.get_job(kept_id)
    assert calls[kept_id] == 1
    assert (job.attempts, job.raw["stallCount"]) == (0, 0), "the lease must never lapse"
    # The control: the same job without heartbeats lost its lease and was charged for it.
    assert lapsed.get_job(lapsed_id).raw["stallCount"] >= 1


def test_ack_batching_is_flushed_on_close(clients: Clients) -> None:
    queue = clients.queue()
    queue.add_bulk([("n", i) for i in range(5)])
    started: list[str] = []
    go = threading.Event()

    def handler(job: Job) -> Any:
        started.append(job.id)
        go.wait(10)
        return job.data

    worker = clients.worker(
        queue.name,
        handler,
        concurrency=5,
        ack_batch_size=1000,  # never full
        ack_flush_interval=600.0,  # never due: only close() can send them (no pull follows)
    ).start()
    wait_until(lambda: len(started) == 5, 10, "every handler to start")
    closing = threading.Thread(target=worker.close, kwargs={"grace": 10.0})
    closing.start()
    time.sleep(0.2)  # the close is waiting for the handlers: no pull will go out any more
    go.set()
    closing.join(15)
    assert not closing.is_alive()
    assert worker.stats.processed == 5
    assert queue.counts().completed == 5
    assert sorted(queue.get_job(i).result for i in started) == [0, 1, 2, 3, 4]


def test_ack_batches_flush_by_size_and_time(clients: Clients) -> None:
    queue = clients.queue()
    queue.add_bulk([("n", i) for i in range(45)])
    worker = clients.worker(
        queue.name, lambda job: None, concurrency=10, ack_batch=True, ack_batch_size=20
    ).start()
    # 2 full batches go by size, the last 5 after the 50 ms flush interval.
    queue.wait_until_finished(timeout=10)
    assert worker.close().processed == 45


def test_graceful_close_finishes_running_jobs(clients: Clients) -> None:
    queue = clients.queue()
    queue.add_bulk([("n", i) for i in range(3)])
    started: list[str] = []

    def handler(job: Job) -> str:
        started.append(job.id)
        time.sleep(0.3)
        return "ok"

    worker = clients.worker(queue.name, handler, concurrency=3).start()
    # All three running (a job still waiting for its handler would be given back at once).
    wait_until(lambda: len(started) == 3, 5, "three handlers to start")
    stats = worker.close(grace=5.0)
    assert (stats.processed, stats.released) == (3, 0)
    assert queue.counts().completed == 3


def test_close_past_grace_releases_held_jobs(clients: Clients) -> None:
    queue = clients.queue()
    job_id = queue.add("stuck", None)
    release = threading.Event()
    started = threading.Event()

    def handler(job: Job) -> None:
        started.set()
        release.wait(10)

    worker = clients.worker(queue.name, handler).start()
    assert started.wait(5)
    try:
        stats = worker.close(grace=0.1)
    finally:
        release.set()
    assert (stats.processed, stats.released) == (0, 1)
    # Over TCP the worker's last long-poll may still wait at the server (it cannot be called
    # back) and take the released job; the connection's close, right after, gives it back.
    wait_until(lambda: queue.get_state(job_id) == "waiting", 5, "the job back in the queue")
    assert queue.get_job(job_id).attempts == 0, "released, not charged an attempt"
