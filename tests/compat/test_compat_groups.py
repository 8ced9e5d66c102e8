"""bunqueue-client 0.1.5 and job groups: the client has no group commands, only the `group_id`
job option (and `Job.group_id`); jobs it pushes that way are scheduled in turn by group, and a
group cap set over the wire holds its real Worker."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from compat_clients import Clients
from shardq_harness import poll_until

pytestmark = pytest.mark.timeout(60)


def test_group_id_reaches_the_job_and_groups_take_turns(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    first = queue.add("a", {"n": 0}, group_id="tenant-a")
    for n in range(1, 4):
        queue.add("a", {"n": n}, group_id="tenant-a")
    for n in range(2):
        queue.add("b", {"n": n}, group_id="tenant-b")
    fetched = queue.get_job(first.id)
    assert fetched is not None and fetched.group_id == "tenant-a"
    pulled = queue.connection.call({"cmd": "PULLB", "queue": qname, "count": 6})
    order = [job["groupId"] for job in pulled["jobs"]]
    assert order == ["tenant-a", "tenant-b", "tenant-a", "tenant-b", "tenant-a", "tenant-a"]


def test_a_group_cap_holds_a_worker(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    cmd = {"cmd": "SetGroupConcurrency", "queue": qname, "groupId": "one", "concurrency": 1}
    assert queue.connection.call(cmd)["ok"]
    lock = threading.Lock()
    running: dict[str, int] = {"one": 0, "free": 0}
    peak: dict[str, int] = {"one": 0, "free": 0}

    def process(job: Any) -> str:
        group = job.group_id
        with lock:
            running[group] += 1
            peak[group] = max(peak[group], running[group])
        time.sleep(0.05)
        with lock:
            running[group] -= 1
        return "ok"

    jobs = [{"name": "g", "data": {"n": n}, "group_id": "one"} for n in range(6)]
    jobs += [{"name": "g", "data": {"n": n}, "group_id": "free"} for n in range(6)]
    queue.add_bulk(jobs)
    clients.worker(qname, process, concurrency=6)
    poll_until(lambda: queue.get_job_counts().get("completed") == 12, 30, "12 completed")
    assert peak["one"] == 1
    assert peak["free"] > 1  # the cap is the group's, not the queue's
