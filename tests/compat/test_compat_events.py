"""bunqueue-client 0.1.5's events against `shardq start`.

0.1.5's events API is its `Worker`'s emitter (`ready`, `active`, `progress`, `completed`,
`failed`, `drained`); it never sends SubscribeEvents, and it drops frames without a `reqId`.
So the server's event frames must not disturb a 0.1.5 connection that subscribed by hand (as a
mixed deployment's tooling may): its calls still get their replies, in the same connection.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from bunqueue import Job
from compat_clients import Clients
from shardq_harness import poll_until

from shardq.client import Queue as ShardqQueue
from shardq.client import QueueEvent

pytestmark = pytest.mark.timeout(60)


def test_worker_events_of_0_1_5(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    seen: list[tuple[str, Any]] = []
    lock = threading.Lock()

    def note(name: str) -> Any:
        def listener(*args: Any) -> None:
            with lock:
                seen.append((name, args[0].id if args and isinstance(args[0], Job) else None))

        return listener

    def process(job: Job) -> Any:
        job.update_progress(30, "a third")
        if job.data.get("fail"):
            raise ValueError("nope")
        return {"ok": 1}

    worker = clients.worker(qname, process)
    for name in ("active", "progress", "completed", "failed"):
        worker.on(name, note(name))
    # Pushed once the listeners are on: a worker that ran a job before `on` would never emit.
    good = queue.add("good", {}).id
    bad = queue.add("bad", {"fail": True}, attempts=1).id
    poll_until(lambda: queue.get_state(bad) in ("failed", "dlq"), 20, "the bad job to fail")
    poll_until(lambda: queue.get_state(good) == "completed", 20, "the good job to complete")

    def by_job() -> set[tuple[str, Any]]:
        with lock:
            return {(name, job) for name, job in seen}

    # The worker emits "completed" and "failed" after the server's reply, so after the state
    # above changed: wait for the events themselves (a loaded machine saw the state first).
    poll_until(
        lambda: {("completed", good), ("failed", bad)} <= by_job(),
        20,
        "the worker's completed and failed events",
        detail=lambda: str(sorted(by_job(), key=str)),
    )
    assert {("completed", good), ("failed", bad)} <= by_job()
    assert ("progress", good) in by_job()


def test_a_subscribed_0_1_5_connection_keeps_working(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    assert queue.connection.call({"cmd": "SubscribeEvents", "queue": qname})["ok"]
    host, port = clients.server.tcp_address
    with ShardqQueue(qname, f"tcp://{host}:{port}") as ours, ours.events() as stream:
        stream.subscribe()
        # Every push sends this connection an event frame; its replies must still match.
        ids = [queue.add("j", {"n": n}).id for n in range(20)]
        assert [queue.get_job(i).data["n"] for i in ids] == list(range(20))
        assert queue.get_job_counts()["waiting"] == 20
        got: list[QueueEvent] = []
        while len(got) < 20:
            event = stream.get(10)
            assert event is not None, got
            got.append(event)
        assert [e.job_id for e in got] == ids
    assert queue.connection.call({"cmd": "UnsubscribeEvents"})["ok"]
