"""Read-only commands (docs/protocol.md §7): views, states, results, counts and listings."""

from __future__ import annotations

from typing import Any

import pytest
from engine_driver import Driver

COUNT_KEYS = {
    "waiting",
    "prioritized",
    "delayed",
    "active",
    "completed",
    "failed",
    "waiting-children",
    "paused",
}


# -- GetJob --------------------------------------------------------------------------------------


def test_get_job_view_of_a_waiting_job(d: Driver) -> None:
    job_id = d.push(data={"a": 1})
    reply, mutations = d.run({"cmd": "GetJob", "id": job_id}, 0)
    assert mutations == []
    job = reply["job"]
    assert (job["id"], job["state"], job["returnvalue"], job["failedReason"]) == (
        job_id,
        "waiting",
        None,
        None,
    )


def test_get_job_view_of_a_completed_job(d: Driver) -> None:
    job_id = d.push()
    d.run_to_completion(at=5, result={"total": 3})
    job = d.job(job_id)
    assert (job["state"], job["returnvalue"], job["completedAt"]) == ("completed", {"total": 3}, 5)


def test_get_job_view_of_a_failed_job(d: Driver) -> None:
    job_id = d.push()
    d.run_to_dlq(error="kaput")
    job = d.job(job_id)
    assert (job["state"], job["failedReason"]) == ("failed", "kaput")


def test_get_job_reports_prioritized(d: Driver) -> None:
    assert d.job(d.push(priority=1))["state"] == "prioritized"


def test_get_job_missing(d: Driver) -> None:
    error = d.err({"cmd": "GetJob", "id": "ghost"})
    assert "not found" in error
    assert error == "Job not found"
    assert d.err({"cmd": "GetJob"}) == "Job not found"


def test_get_job_by_custom_id(d: Driver) -> None:
    d.push(jobId="order-1", data="x")
    job = d.ok({"cmd": "GetJobByCustomId", "customId": "order-1"})["job"]
    assert (job["id"], job["customId"], job["data"], job["state"]) == (
        "order-1",
        "order-1",
        "x",
        "waiting",
    )


def test_get_job_by_custom_id_misses(d: Driver) -> None:
    plain = d.push()
    assert d.err({"cmd": "GetJobByCustomId", "customId": "ghost"}) == "Job not found"
    assert d.err({"cmd": "GetJobByCustomId", "customId": plain}) == "Job not found"


# -- GetState ------------------------------------------------------------------------------------


def test_get_state_in_every_state(d: Driver) -> None:
    completed, failed, active = d.push(), d.push(), d.push()
    d.run_to_completion()
    d.run_to_dlq()
    d.pull_id()
    waiting = d.push()
    prioritized = d.push(priority=4)
    delayed = d.push(delay=100)
    children = d.push(dependsOn=[waiting])
    expected = {
        completed: "completed",
        failed: "failed",
        active: "active",
        waiting: "waiting",
        prioritized: "prioritized",
        delayed: "delayed",
        children: "waiting-children",
        "ghost": "unknown",
    }
    for job_id, state in expected.items():
        reply, mutations = d.run({"cmd": "GetState", "id": job_id}, 0)
        assert reply == {"ok": True, "id": job_id, "state": state}
        assert mutations == []


def test_negative_priority_is_plain_waiting(d: Driver) -> None:
    assert d.state(d.push(priority=-5)) == "waiting"


# -- GetResult -----------------------------------------------------------------------------------


def test_get_result(d: Driver) -> None:
    with_result, null_result, no_result, pending = d.push(), d.push(), d.push(), d.push()
    d.run_to_completion(result=[1, 2])
    d.run_to_completion(result=None)
    job_id, token = d.pull_id()
    d.ok({"cmd": "ACK", "id": job_id, "token": token})
    assert d.ok({"cmd": "GetResult", "id": with_result}) == {
        "ok": True,
        "id": with_result,
        "result": [1, 2],
    }
    assert d.ok({"cmd": "GetResult", "id": null_result}) == {
        "ok": True,
        "id": null_result,
        "result": None,
    }
    assert d.ok({"cmd": "GetResult", "id": no_result}) == {"ok": True, "id": no_result}
    assert d.ok({"cmd": "GetResult", "id": pending}) == {"ok": True, "id": pending}
    assert d.ok({"cmd": "GetResult", "id": "ghost"}) == {"ok": True, "id": "ghost"}


# -- counts --------------------------------------------------------------------------------------


def test_get_job_counts(d: Driver) -> None:
    d.push()
    d.push()
    d.push()
    d.run_to_completion()
    d.run_to_dlq()
    d.pull_id()
    d.push()
    d.push(priority=2)
    d.push(priority=3)
    d.push(delay=10)
    d.push(dependsOn=[d.push(queue="other")])
    counts = d.counts()
    assert set(counts) == COUNT_KEYS
    assert counts == {
        "waiting": 1,
        "prioritized": 2,
        "delayed": 1,
        "active": 1,
        "completed": 1,
        "failed": 1,
        "waiting-children": 1,
        "paused": 0,
    }


def test_get_job_counts_of_an_unknown_queue(d: Driver) -> None:
    assert d.counts("ghost") == dict.fromkeys(COUNT_KEYS, 0)


def test_count_is_waiting_prioritized_and_delayed(d: Driver) -> None:
    d.push()
    d.pull_id()
    d.push()
    d.push(priority=1)
    d.push(delay=100)
    d.push(dependsOn=[d.push(queue="other")])
    assert d.ok({"cmd": "Count", "queue": "q"}) == {"ok": True, "count": 3}
    assert d.ok({"cmd": "Count", "queue": "ghost"}) == {"ok": True, "count": 0}


def test_counts_per_priority(d: Driver) -> None:
    d.push(priority=9)
    d.pull_id()
    d.push()
    d.push()
    d.push(priority=5)
    d.push(priority=5, delay=100)
    d.push(priority=-1)
    reply = d.ok({"cmd": "GetCountsPerPriority", "queue": "q"})
    assert reply == {"ok": True, "queue": "q", "counts": {"0": 2, "5": 2, "-1": 1}}
    assert d.ok({"cmd": "GetCountsPerPriority", "queue": "ghost"})["counts"] == {}


# -- GetJobs -------------------------------------------------------------------------------------


def _jobs(d: Driver, **fields: Any) -> list[Any]:
    return [j["data"] for j in d.ok({"cmd": "GetJobs", "queue": "q", **fields})["jobs"]]


@pytest.fixture
def mixed(d: Driver) -> Driver:
    d.push(data="done", at=0)
    d.run_to_completion(at=0)
    d.push(data="w1", at=1)
    d.push(data="p1", at=2, priority=1)
    d.push(data="d1", at=3, delay=100)
    d.push(data="w2", at=4)
    return d


def test_get_jobs_all_in_creation_order(mixed: Driver) -> None:
    assert _jobs(mixed) == ["done", "w1", "p1", "d1", "w2"]


def test_get_jobs_view_has_state(mixed: Driver) -> None:
    jobs = mixed.ok({"cmd": "GetJobs", "queue": "q"})["jobs"]
    assert [j["state"] for j in jobs] == [
        "completed",
        "waiting",
        "prioritized",
        "delayed",
        "waiting",
    ]
    assert jobs[0]["returnvalue"] is None and "failedReason" in jobs[0]


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("waiting", ["w1", "w2"]),
        ("wait", ["w1", "w2"]),
        ("prioritized", ["p1"]),
        ("delayed", ["d1"]),
        ("completed", ["done"]),
        ("active", []),
        (["waiting", "delayed"], ["w1", "d1", "w2"]),
        (["completed", "prioritized"], ["done", "p1"]),
        ([], []),
    ],
)
def test_get_jobs_state_filter(mixed: Driver, state: Any, expected: list[str]) -> None:
    assert _jobs(mixed, state=state) == expected


def test_get_jobs_paging(mixed: Driver) -> None:
    assert _jobs(mixed, offset=1, limit=2) == ["w1", "p1"]
    assert _jobs(mixed, offset=4, limit=10) == ["w2"]
    assert _jobs(mixed, offset=10) == []
    assert _jobs(mixed, limit=0) == []


def test_get_jobs_descending(mixed: Driver) -> None:
    assert _jobs(mixed, asc=False) == ["w2", "d1", "p1", "w1", "done"]
    assert _jobs(mixed, asc=False, limit=2, state="waiting") == ["w2", "w1"]


def test_get_jobs_default_limit_is_100(d: Driver) -> None:
    for i in range(120):
        d.push(data=i)
    assert _jobs(d) == list(range(100))
    assert _jobs(d, offset=100) == list(range(100, 120))


def test_get_jobs_of_an_unknown_queue(d: Driver) -> None:
    assert d.ok({"cmd": "GetJobs", "queue": "ghost"}) == {"ok": True, "jobs": []}


def test_queries_emit_no_mutations(mixed: Driver) -> None:
    job_id = mixed.push(data="x")
    for cmd in (
        {"cmd": "GetJob", "id": job_id},
        {"cmd": "GetState", "id": job_id},
        {"cmd": "GetResult", "id": job_id},
        {"cmd": "GetJobCounts", "queue": "q"},
        {"cmd": "GetCountsPerPriority", "queue": "q"},
        {"cmd": "Count", "queue": "q"},
        {"cmd": "GetJobs", "queue": "q"},
        {"cmd": "GetLogs", "id": job_id},
        {"cmd": "IsPaused", "queue": "q"},
        {"cmd": "ListQueues"},
        {"cmd": "Dlq", "queue": "q"},
        {"cmd": "GetDlqConfig", "queue": "q"},
        {"cmd": "GetStallConfig", "queue": "q"},
    ):
        reply, mutations = mixed.run(cmd, 50)
        assert reply["ok"] is True, cmd
        assert mutations == [], cmd
