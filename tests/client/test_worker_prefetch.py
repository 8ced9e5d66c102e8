"""The worker's prefetch buffer, batched ACKs, crash behaviour and registration, against the
real server, for each transport and client kind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from client_helpers import Clients, wait_until
from shardq_harness import ShardqServer

from shardq.client import Connection, Job, JobOptions, WorkerConfig

REPO = Path(__file__).resolve().parents[2]
PREFETCH_MAX_RANGE = "prefetch_max must be None or an int in prefetch..10000"


def owner_of(worker: Any) -> str:
    """The owner (= registry id) of a `Worker` or a portal view of an `AsyncWorker`."""
    impl = getattr(worker, "async_worker", worker)
    return str(impl.config.owner)


def list_workers(url: str) -> dict[str, dict[str, Any]]:
    with Connection(url, timeout=5.0) as conn:
        reply = conn.call({"cmd": "ListWorkers"})
    return {w["id"]: w for w in reply["data"]["workers"]}


@pytest.mark.parametrize("backlog", [10, 4])
def test_prefetched_jobs_go_back_at_once_on_close(clients: Clients, backlog: int) -> None:
    """With a backlog of 4 the buffer (10) is not full, so the worker keeps pulling: that
    pull must not be a long-poll waiting at the server, which would take the released jobs."""
    queue = clients.queue()
    first = queue.add("first", None)
    rest = queue.add_bulk([("n", i) for i in range(backlog)])
    go = threading.Event()
    ran_a: list[str] = []
    ran_b: dict[str, float] = {}

    def slow_first(job: Job) -> None:
        ran_a.append(job.id)
        go.wait(20)  # holds the only handler while 10 jobs wait in the buffer

    # Renewed often, so a TCP close alone would not give the waiting jobs back (docs/protocol.md
    # §2.6: a renewed lease outlives its connection); a long TTL, so lapsing cannot
    # explain a prompt redelivery either. Only the explicit release can.
    a = clients.worker(
        queue.name, slow_first, prefetch=10, heartbeat_interval=0.05, lock_ttl_ms=30_000
    ).start()
    wait_until(lambda: ran_a == [first], 10, "the first job to start")
    wait_until(lambda: queue.counts().active == 1 + backlog, 10, "the backlog prefetched")
    time.sleep(0.3)  # a few renewals of the waiting leases

    closing = threading.Thread(target=a.close, kwargs={"grace": 20.0})
    started = time.monotonic()
    closing.start()
    b = clients.worker(queue.name, lambda job: ran_b.setdefault(job.id, time.monotonic()))
    b.start()
    try:
        wait_until(lambda: len(ran_b) == backlog, 10, "the released jobs to reach the other worker")
        assert closing.is_alive(), "released while the first handler still runs"
        assert max(ran_b.values()) - started < 5.0
    finally:
        go.set()
        closing.join(20)
    assert a.stats.processed == 1 and a.stats.released == backlog
    assert sorted(ran_b) == sorted(rest)
    queue.wait_until_finished(timeout=10)
    assert all(queue.get_job(i).attempts == 0 for i in rest), "released, never charged"
    b.close()


def test_prefetched_job_outlives_its_lease_ttl(clients: Clients) -> None:
    queue = clients.queue()
    slow = queue.add("slow", None)
    waiting = queue.add_bulk([("fast", i) for i in range(3)])
    runs: list[tuple[str, int]] = []

    def handler(job: Job) -> str:
        runs.append((job.id, job.attempts))
        if job.name == "slow":
            time.sleep(4.0)  # the others wait in the buffer for > 3 lease TTLs
        return "ok"

    # A 1.2 s lease, renewed every 0.4 s (a third of it): a waiting job starts while its last
    # renewal left less than 1.08 s ago. With 400 ms (renewals every 133 ms, 360 ms to start
    # in), one heartbeat late by a quarter of a second on a loaded CI machine is enough to
    # skip a job, which is the lapsed-lease control's case, not this one's.
    worker = clients.worker(queue.name, handler, prefetch=3, lock_ttl_ms=1_200).start()
    queue.wait_until_finished(timeout=30)
    stats = worker.close()

    assert runs == [(slow, 0)] + [(i, 0) for i in waiting], "each ran once, on its first lease"
    assert (stats.processed, stats.expired, stats.lost) == (4, 0, 0)
    for job_id in [slow, *waiting]:
        job = queue.get_job(job_id)
        assert (job.state, job.attempts, job.raw["stallCount"]) == ("completed", 0, 0)


# A start this late into a 400 ms lease is a lapsed lease's, not the hand-off's (see below).
LATE_MS = 1_000


def test_prefetched_job_whose_lease_lapsed_is_not_run(clients: Clients) -> None:
    """The control: no renewals, so the waiting jobs' leases lapse; the worker must skip
    them (another worker may hold them by then) and run only a later delivery."""
    queue = clients.queue()
    queue.add("slow", None, JobOptions(max_attempts=5))
    waiting = queue.add_bulk([("fast", i, JobOptions(max_attempts=5)) for i in range(3)])
    late_starts: list[tuple[str, float]] = []
    first_slow = threading.Event()

    def handler(job: Job) -> None:
        # Without renewals a lease ends 400 ms after the pull that granted it (`startedAt`).
        # The worker decides to start a job up to 360 ms into its lease (the margin is a tenth
        # of a short TTL), and its handler thread runs a moment later: on a loaded CI
        # machine that hand-off can take more than the 40 ms left, and a job started in time
        # be seen here at 400-odd ms. The jobs this test is about waited 1.5 s behind the slow one:
        # run on their first lease they would be seen past 1,500 ms, far beyond LATE_MS.
        age_ms = time.time() * 1000 - float(job.raw["startedAt"])
        if age_ms >= LATE_MS:
            late_starts.append((job.id, age_ms))
        if job.name == "slow" and not first_slow.is_set():
            first_slow.set()
            time.sleep(1.5)

    worker = clients.worker(
        queue.name, handler, prefetch=3, lock_ttl_ms=400, heartbeat_interval=60.0
    ).start()
    wait_until(lambda: all(queue.get_state(i) == "completed" for i in waiting), 20)
    stats = worker.close()
    assert late_starts == [], "a job started after its lease could have lapsed"
    assert stats.expired >= 1, "the jobs that waited behind the slow one were skipped"
    assert {queue.get_job(i).attempts for i in waiting} & {1, 2}, "and ran on a later lease"


def test_ack_batches_flush_on_their_timer(clients: Clients) -> None:
    queue = clients.queue()
    fast = queue.add("fast", 0.0)
    queue.add_bulk([("slow", 1.5) for _ in range(4)])
    finished: dict[str, float] = {}

    def handler(job: Job) -> None:
        time.sleep(job.data)
        finished[job.id] = time.monotonic()

    # concurrency 1 + prefetch 4: all five jobs are held at once. While the first slow job
    # runs, three wait (more than half of prefetch): no pull goes out, so nothing carries
    # the fast job's ACK but the 0.2 s timer (the batch of 1000 never fills).
    worker = clients.worker(
        queue.name, handler, prefetch=4, ack_batch_size=1000, ack_flush_interval=0.2
    ).start()
    wait_until(lambda: queue.get_state(fast) == "completed", 10, "the timer's ACKB")
    seen = time.monotonic()
    assert len(finished) == 1, "sent while the first slow job still runs"
    worker.close(grace=0.0)
    assert 0.15 <= seen - finished[fast] < 1.2, "sent by the 0.2 s timer"


class Unencodable:
    pass


def test_exactly_the_right_jobs_complete(clients: Clients) -> None:
    queue = clients.queue()
    once = JobOptions(max_attempts=1)
    ids = queue.add_bulk([("n", i, once) for i in range(300)])
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(job: Job) -> Any:
        with lock:
            calls[job.id] += 1
        if job.data % 50 == 7:
            raise ValueError(f"bad {job.data}")
        if job.data % 50 == 13:
            return Unencodable()  # its ACKB falls back to ACKs; this one fails
        return {"double": job.data * 2}

    stats = clients.worker(queue.name, handler, concurrency=8).run_until_idle(timeout=30)
    assert set(calls) == set(ids) and set(calls.values()) == {1}, "each job ran exactly once"
    assert (stats.processed, stats.failed, stats.lost) == (288, 12, 0)
    for i, job_id in enumerate(ids):
        job = queue.get_job(job_id)
        if i % 50 == 7:
            assert (job.state, job.failed_reason) == ("failed", f"bad {i}")
        elif i % 50 == 13:
            assert job.state == "failed" and "cannot be sent" in (job.failed_reason or "")
        else:
            assert (job.state, job.result) == ("completed", {"double": i * 2})


def _active_sampler(queue: Any, every: int) -> tuple[list[int], Any]:
    """A handler that runs each job once (counted) and reads the queue's active count every
    `every` jobs: the server's view of how many jobs the worker holds."""
    calls: Counter[str] = Counter()
    active: list[int] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        with lock:
            calls[job.id] += 1
            sample = sum(calls.values()) % every == 0
        if sample:
            active.append(queue.counts().active)

    handler.calls = calls  # type: ignore[attr-defined]
    return active, handler


def test_prefetch_grows_for_fast_jobs(clients: Clients) -> None:
    """Without growth this worker never holds more than 2 + 4 jobs (the server's active count
    never passes it); quick jobs make it pull up to 2 + 64 at a time, each job still once."""
    queue = clients.queue()
    ids = queue.add_bulk([("n", i) for i in range(3000)])
    active, handler = _active_sampler(queue, 100)
    worker = clients.worker(queue.name, handler, concurrency=2, prefetch=4, prefetch_max=64)
    stats = worker.run_until_idle(timeout=60)
    assert set(handler.calls) == set(ids) and set(handler.calls.values()) == {1}
    assert (stats.processed, stats.lost, stats.expired) == (3000, 0, 0)
    assert max(active) > 6, f"the buffer never grew: active counts {active}"
    assert max(active) <= 66, "never past concurrency + prefetch_max"


def test_prefetch_does_not_grow_for_slow_jobs(clients: Clients) -> None:
    """A job outlasts a round trip: the buffer stays at `prefetch`, so slow jobs are not
    hoarded (the first pull, which always finds the buffer empty, is no reason to grow)."""
    queue = clients.queue()
    queue.add_bulk([("n", i) for i in range(8)])
    active: list[int] = []

    def slow(job: Job) -> None:
        active.append(queue.counts().active)
        time.sleep(0.2)

    worker = clients.worker(queue.name, slow, concurrency=1, prefetch=2, prefetch_max=64)
    stats = worker.run_until_idle(timeout=30)
    assert stats.processed == 8
    assert max(active) <= 3, f"slow jobs were hoarded: active counts {active}"


def test_ack_per_job_still_works(clients: Clients) -> None:
    queue = clients.queue()
    ids = queue.add_bulk([("n", i) for i in range(50)])
    stats = clients.worker(
        queue.name, lambda job: job.data + 1, concurrency=4, ack_batch=False
    ).run_until_idle(timeout=20)
    assert stats.processed == 50
    assert [queue.get_job(i).result for i in ids] == list(range(1, 51))


WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys, time
    from shardq.client import AsyncWorker, Worker

    url, queue, mode, record = sys.argv[1:5]
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def handle(job):
        os.write(fd, job.id.encode() + b"\\n")
        time.sleep(0.002)

    async def handle_async(job):
        os.write(fd, job.id.encode() + b"\\n")
        await asyncio.sleep(0.002)

    options = dict(concurrency=4, lock_ttl_ms=2000, url=url)
    if mode == "sync":
        Worker(queue, handle, **options).run()
    else:
        asyncio.run(AsyncWorker(queue, handle_async, **options).run())
    """
)


def test_at_least_once_when_a_worker_is_killed(
    clients: Clients, tmp_path: Path, transport: str, mode: str
) -> None:
    queue = clients.queue()
    ids = queue.add_bulk([("n", i) for i in range(3000)])
    record = tmp_path / "ran.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER_SCRIPT, clients.url, queue.name, mode, str(record)],
        env=env,
    )
    try:
        wait_until(lambda: record.exists() and record.stat().st_size > 300 * 27, 30, "progress")
        assert queue.counts().active > 0, "killed with jobs leased (running or prefetched)"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    killed_at = time.monotonic()
    ran_before = set(record.read_text().split())

    done: set[str] = set()
    survivor = clients.worker(queue.name, lambda job: done.add(job.id), concurrency=4)
    survivor.run_until_idle(timeout=30)
    assert time.monotonic() - killed_at < 20, "leases of a dead worker come back in bounded time"
    counts = queue.counts()
    assert (counts.completed, counts.failed, counts.active) == (3000, 0, 0)
    assert set(ids) <= ran_before | done, "every job ran at least once"
    assert all(queue.get_job(i).state == "completed" for i in ids[::97])


def test_worker_registers_and_unregisters(clients: Clients, server: ShardqServer) -> None:
    queue = clients.queue()
    queue.add_bulk([("n", i) for i in range(5)])
    worker = clients.worker(queue.name, lambda job: None, concurrency=3, name="mailer").start()
    owner = owner_of(worker)
    entry = wait_until(lambda: list_workers(clients.url).get(owner), 10, "the registration")
    assert (entry["name"], entry["queues"], entry["concurrency"]) == ("mailer", [queue.name], 3)
    assert entry["status"] == "active" and entry["pid"] == os.getpid()
    queue.wait_until_finished(timeout=10)
    worker.close()
    assert owner not in list_workers(clients.url), "UnregisterWorker on close"

    silent = clients.worker(queue.name, lambda job: None, register=False).start()
    time.sleep(0.3)
    assert owner_of(silent) not in list_workers(clients.url)
    silent.close()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("prefetch", -1, "prefetch must be an int in 0..10000, got -1"),
        ("prefetch", 2.5, "prefetch must be an int in 0..10000, got 2.5"),
        ("prefetch_max", 63, f"{PREFETCH_MAX_RANGE}, got 63"),
        ("prefetch_max", 10_001, f"{PREFETCH_MAX_RANGE}, got 10001"),
        ("ack_batch", "yes", "ack_batch must be a bool, got 'yes'"),
        ("ack_batch_size", 0, "ack_batch_size must be an int in 1..1000, got 0"),
        ("ack_flush_interval", 0, "ack_flush_interval must be seconds > 0, got 0"),
        ("concurrency", 0, "concurrency must be an int >= 1, got 0"),
        ("name", "", "name must be None or a non-empty str, got ''"),
        ("register", None, "register must be a bool, got None"),
    ],
)
def test_worker_options_are_validated(option: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=f"^worker setting {message}$"):
        WorkerConfig(**{option: value})
