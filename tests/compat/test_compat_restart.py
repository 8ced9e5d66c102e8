"""bunqueue-client 0.1.5 through a `kill -9` of the whole shardq tree and a restart.

A producer and a worker stay connected while every shardq process is SIGKILLed and the server
is started again on the same port and data. Both must reconnect on their own (the client's
reconnect-with-backoff), and every job must complete: durable pushes with custom ids make the
producer's retries idempotent, and jobs that were active at the crash come back with an
attempt charged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from bunqueue import BunqueueError, Job
from compat_clients import Clients
from shardq_harness import ShardqServer, poll_until

pytestmark = pytest.mark.timeout(90)

JOBS = 150


def test_kill9_and_restart_with_a_producer_and_a_worker(
    server_factory: Callable[..., ShardqServer],
) -> None:
    server = server_factory(shards=2)
    clients = Clients(server)
    qname = "restart"
    producer = clients.queue(qname, command_timeout=3.0)
    ran: list[str] = []
    producer_errors: list[BaseException] = []
    produced = threading.Event()

    def process(job: Job) -> str:
        ran.append(job.id)
        time.sleep(0.01)
        return f"done {job.data['i']}"

    def produce() -> None:
        deadline = time.monotonic() + 60
        for i in range(JOBS):
            while True:
                try:
                    producer.add("r", {"i": i}, job_id=f"r-{i}", durable=True)
                    break
                except BunqueueError as e:  # the server is down: retry the same custom id
                    producer_errors.append(e)
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            time.sleep(0.004)
        produced.set()

    worker = clients.worker(qname, process, concurrency=4, heartbeat_interval_s=0.5)
    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        poll_until(lambda: len(ran) >= 30, 20, "30 jobs to run before the crash")
        assert not produced.is_set(), "the producer finished before the crash; raise JOBS"
        first_generation = (producer.connection.generation, worker.connection.generation)
        server.kill9_tree()
        server.start()
        thread.join(70)
        assert produced.is_set(), "the producer did not finish"
        assert producer_errors, "the producer never saw the crash"

        checker = clients.queue(qname)
        ids = [f"r-{i}" for i in range(JOBS)]

        def left() -> list[str]:
            return [i for i in ids if checker.get_state(i) != "completed"]

        poll_until(lambda: not left(), 40, "every job to complete", detail=lambda: str(left()))
        assert [checker.get_result(i) for i in ids] == [f"done {i}" for i in range(JOBS)]
        assert set(ran) == set(ids)
        # Both clients reconnected, and the worker registered itself again.
        assert producer.connection.generation > first_generation[0]
        assert worker.connection.generation > first_generation[1]
        poll_until(
            lambda: [w["id"] for w in checker.get_workers()] == [worker.worker_id],
            10,
            "the worker to register again",
        )
    finally:
        clients.close()
