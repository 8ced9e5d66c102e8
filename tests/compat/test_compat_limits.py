"""bunqueue-client 0.1.5's queue limits (`set_global_concurrency`, `set_global_rate_limit` and
their removals) against `shardq start`: a real Worker of concurrency 6 is held to the cap."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from compat_clients import Clients
from shardq_harness import poll_until

pytestmark = pytest.mark.timeout(60)


def test_global_concurrency_holds_a_worker_to_the_cap(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    queue.set_global_concurrency(2)
    lock = threading.Lock()
    running, peak = [0], [0]

    def process(job: Any) -> str:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return "ok"

    queue.add_bulk([{"name": "capped", "data": {"n": n}} for n in range(12)])
    clients.worker(qname, process, concurrency=6)
    poll_until(lambda: queue.get_job_counts().get("completed") == 12, 30, "12 completed")
    assert peak[0] == 2
    queue.remove_global_concurrency()


def test_global_rate_limit_and_its_removal(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    queue.set_global_rate_limit(3)  # the client sends no duration: 1000 ms, as in bunqueue
    queue.add_bulk([{"name": "r", "data": {"n": n}} for n in range(10)])
    raw = queue.connection.call({"cmd": "PULLB", "queue": qname, "count": 10})
    assert len(raw["jobs"]) == 3
    queue.remove_global_rate_limit()
    rest = queue.connection.call({"cmd": "PULLB", "queue": qname, "count": 10})
    assert len(rest["jobs"]) == 7
