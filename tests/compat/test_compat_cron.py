"""bunqueue-client 0.1.5's job schedulers (`Cron*` commands) against `shardq start`."""

from __future__ import annotations

import time

import pytest
from compat_clients import Clients
from shardq_harness import poll_until

pytestmark = pytest.mark.timeout(60)


def test_schedulers_fire_list_and_remove(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    queue.every("beat", 1000, {"k": 1}, prevent_overlap=False)
    queue.add_cron("nightly", "0 3 * * *", {"x": 1}, tz="Europe/Berlin")
    beat = queue.get_job_scheduler("beat")
    assert beat is not None
    assert (beat["queue"], beat["repeatEvery"], beat["schedule"]) == (qname, 1000, None)
    nightly = queue.get_job_scheduler("nightly")
    assert nightly is not None
    assert (nightly["schedule"], nightly["timezone"]) == ("0 3 * * *", "Europe/Berlin")
    assert nightly["nextRun"] > time.time() * 1000
    assert sorted(s["name"] for s in queue.get_job_schedulers()) == ["beat", "nightly"]
    assert queue.get_job_schedulers_count() == 2

    poll_until(lambda: queue.count() >= 2, 10, "two beats")
    jobs = queue.get_jobs()
    assert {j.name for j in jobs} == {"beat"}
    assert all(j.data["k"] == 1 for j in jobs)

    queue.remove_job_scheduler("beat")
    assert queue.get_job_scheduler("beat") is None
    assert [s["name"] for s in queue.get_job_schedulers()] == ["nightly"]
    queue.remove_job_scheduler("nightly")
    assert queue.get_job_schedulers_count() == 0


def test_an_unknown_scheduler_reads_as_none(clients: Clients, qname: str) -> None:
    assert clients.queue(qname).get_job_scheduler("never-made") is None


def test_a_repeating_job_runs_limit_times(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    runs: list[int] = []
    queue.add("again", {"k": 2}, repeat={"every": 200, "limit": 3})
    clients.worker(qname, lambda job: runs.append(job.data["k"]) or "done")
    poll_until(lambda: queue.get_job_counts().get("completed") == 3, 15, "three runs")
    time.sleep(0.6)  # three more periods: the chain must have stopped at its limit
    assert runs == [2, 2, 2]
    assert queue.get_job_counts().get("completed") == 3
