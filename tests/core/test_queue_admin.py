"""Queue control (docs/protocol.md §9), the DLQ commands (§10) and the stall and DLQ configs."""

from __future__ import annotations

from typing import Any

import pytest
from engine_driver import Driver, kinds

DEFAULT_STALL = {"enabled": True, "stallInterval": 30_000, "maxStalls": 3, "gracePeriod": 5000}
DEFAULT_DLQ = {
    "autoRetry": False,
    "autoRetryInterval": 3_600_000,
    "maxAutoRetries": 3,
    "maxAge": 604_800_000,
    "maxEntries": 10_000,
}


def _fill(d: Driver) -> dict[str, str]:
    """One job in every state of queue "q" (the dependency lives in queue "dep")."""
    jobs = {
        "completed": d.push(data="completed"),
        "failed": d.push(data="failed"),
        "active": d.push(data="active"),
    }
    d.run_to_completion(at=1)
    d.run_to_dlq(at=2)
    d.pull_id(at=3)
    jobs["waiting"] = d.push(data="waiting", at=4)
    jobs["prioritized"] = d.push(data="prioritized", priority=2, at=4)
    jobs["delayed"] = d.push(data="delayed", delay=60_000, at=4)
    jobs["waiting-children"] = d.push(dependsOn=[d.push(queue="dep")], at=4)
    for state, job_id in jobs.items():
        assert d.state(job_id, at=4) == state
    return jobs


# -- pause and resume ----------------------------------------------------------------------------


def test_pause_resume_is_paused(d: Driver) -> None:
    assert d.ok({"cmd": "IsPaused", "queue": "q"}) == {"ok": True, "paused": False}
    reply, mutations = d.run({"cmd": "Pause", "queue": "q"}, 0)
    assert reply == {"ok": True}
    assert mutations == [
        ("queue", "q", {"paused": True, "stall": DEFAULT_STALL, "dlq": DEFAULT_DLQ})
    ]
    assert d.ok({"cmd": "IsPaused", "queue": "q"})["paused"] is True
    _, mutations = d.run({"cmd": "Resume", "queue": "q"}, 1)
    assert mutations[0][2]["paused"] is False
    assert ("ready", "q", "") in d.events
    assert d.ok({"cmd": "IsPaused", "queue": "q"})["paused"] is False


def test_pause_affects_only_its_queue(d: Driver) -> None:
    d.push(queue="a")
    b = d.push(queue="b")
    d.ok({"cmd": "Pause", "queue": "a"})
    assert d.pull(queue="a") == (None, None)
    assert d.pull_id(queue="b")[0] == b


def test_paused_queue_still_accepts_pushes_and_acks(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id()
    d.ok({"cmd": "Pause", "queue": "q"})
    d.push()
    d.ack(job_id, token)
    assert d.state(job_id) == "completed"


def test_counts_report_paused_work(d: Driver) -> None:
    d.push()
    d.push()
    d.push(priority=3)
    d.push(delay=1000)
    before = d.counts()
    assert (before["waiting"], before["prioritized"], before["paused"]) == (2, 1, 0)
    d.ok({"cmd": "Pause", "queue": "q"})
    counts = d.counts()
    assert (counts["waiting"], counts["prioritized"], counts["paused"]) == (0, 0, 3)
    assert counts["delayed"] == 1


# -- drain ---------------------------------------------------------------------------------------


def test_drain_removes_waiting_and_delayed_only(d: Driver) -> None:
    jobs = _fill(d)
    reply, mutations = d.run({"cmd": "Drain", "queue": "q"}, 10)
    assert reply == {"ok": True, "count": 3}
    assert sorted(m[1] for m in mutations) == sorted(
        [jobs["waiting"], jobs["prioritized"], jobs["delayed"]]
    )
    assert kinds(mutations) == ["del"] * 3
    for state in ("active", "completed", "failed", "waiting-children"):
        assert d.state(jobs[state]) == state
    for state in ("waiting", "prioritized", "delayed"):
        assert d.state(jobs[state]) == "unknown"


def test_drain_of_an_unknown_queue(d: Driver) -> None:
    assert d.run({"cmd": "Drain", "queue": "ghost"}, 0) == ({"ok": True, "count": 0}, [])


# -- clean ---------------------------------------------------------------------------------------


def test_clean_completed_by_grace(d: Driver) -> None:
    old = [d.push(data=i) for i in range(3)]
    for t in (100, 200, 300):
        d.run_to_completion(at=t)
    young = d.push(data="young")
    d.run_to_completion(at=900)
    reply, mutations = d.run(
        {"cmd": "Clean", "queue": "q", "state": "completed", "grace": 700}, 1000
    )
    assert reply == {"ok": True, "count": 3, "ids": old}
    assert mutations == [("del", i) for i in old]
    assert d.state(young) == "completed"


def test_clean_limit(d: Driver) -> None:
    ids = [d.push(data=i) for i in range(5)]
    for t in range(5):
        d.run_to_completion(at=t)
    reply = d.ok({"cmd": "Clean", "queue": "q", "state": "completed", "grace": 0, "limit": 2}, 10)
    assert reply == {"ok": True, "count": 2, "ids": ids[:2]}
    assert d.counts()["completed"] == 3


def test_clean_failed(d: Driver) -> None:
    jobs = _fill(d)
    reply = d.ok({"cmd": "Clean", "queue": "q", "state": "failed", "grace": 0}, 10)
    assert reply["ids"] == [jobs["failed"]]
    assert d.dlq_ids() == []


def test_clean_defaults_to_waiting_like_jobs(d: Driver) -> None:
    jobs = _fill(d)
    reply = d.ok({"cmd": "Clean", "queue": "q", "grace": 0}, 10)
    assert sorted(reply["ids"]) == sorted([jobs["waiting"], jobs["prioritized"], jobs["delayed"]])


def test_clean_waiting_respects_age(d: Driver) -> None:
    old = d.push(at=0)
    d.push(at=900)
    reply = d.ok({"cmd": "Clean", "queue": "q", "state": "waiting", "grace": 500}, 1000)
    assert reply["ids"] == [old]


@pytest.mark.parametrize("state", ["active", "unknown-state", 5])
def test_clean_of_other_states_removes_nothing(d: Driver, state: Any) -> None:
    _fill(d)
    assert d.ok({"cmd": "Clean", "queue": "q", "state": state, "grace": 0}, 10) == {
        "ok": True,
        "count": 0,
        "ids": [],
    }


# -- obliterate ----------------------------------------------------------------------------------


def test_obliterate_removes_everything_with_one_qdel(d: Driver) -> None:
    jobs = _fill(d)
    other = d.push(queue="other")
    d.ok({"cmd": "Pause", "queue": "q"})
    reply, mutations = d.run({"cmd": "Obliterate", "queue": "q"}, 10)
    assert reply == {"ok": True}
    assert mutations == [("qdel", "q")]
    for job_id in jobs.values():
        assert d.state(job_id) == "unknown"
    assert d.state(other) == "waiting"
    assert d.counts() == dict.fromkeys(d.counts(), 0)
    assert d.ok({"cmd": "IsPaused", "queue": "q"})["paused"] is False
    assert "q" not in d.ok({"cmd": "ListQueues"})["queues"]
    assert d.dlq_ids() == []


def test_obliterated_jobs_leave_no_timers_behind(d: Driver) -> None:
    d.push(delay=100, ttl=5000)
    active = d.push(timeout=200)
    d.pull_id(queue="q", at=0, lockTtl=300)  # takes `active`
    d.ok({"cmd": "Obliterate", "queue": "q"}, 1)
    assert d.tick(10_000)[1] == []
    error = d.err({"cmd": "ACK", "id": active}, 10_001)
    assert error == f"Job not found or not in processing state: {active}"


def test_queue_is_usable_after_obliterate(d: Driver) -> None:
    d.push()
    d.ok({"cmd": "Obliterate", "queue": "q"})
    job_id = d.push()
    assert d.pull_id()[0] == job_id


def test_obliterate_unknown_queue(d: Driver) -> None:
    assert d.run({"cmd": "Obliterate", "queue": "ghost"}, 0) == ({"ok": True}, [("qdel", "ghost")])


# -- list queues ---------------------------------------------------------------------------------


def test_list_queues(d: Driver) -> None:
    assert d.ok({"cmd": "ListQueues"}) == {"ok": True, "queues": []}
    d.push(queue="zeta")
    d.push(queue="alpha")
    d.push(queue="mid")
    assert d.ok({"cmd": "ListQueues"})["queues"] == ["alpha", "mid", "zeta"]


def test_reads_do_not_create_queues(d: Driver) -> None:
    for cmd in (
        "GetJobCounts",
        "IsPaused",
        "Count",
        "GetJobs",
        "GetStallConfig",
        "GetDlqConfig",
        "Dlq",
        "GetCountsPerPriority",
    ):
        d.ok({"cmd": cmd, "queue": "ghost"})
    assert d.ok({"cmd": "ListQueues"})["queues"] == []


# -- DLQ commands ----------------------------------------------------------------------------


def test_dlq_lists_jobs_and_entries(d: Driver) -> None:
    ids = [d.push(data=i) for i in range(3)]
    for t in range(3):
        d.run_to_dlq(at=t)
    reply = d.ok({"cmd": "Dlq", "queue": "q"})
    assert [j["id"] for j in reply["jobs"]] == ids
    assert [e["job"]["id"] for e in reply["entries"]] == ids
    assert [e["enteredAt"] for e in reply["entries"]] == [0, 1, 2]
    assert all(e["reason"] == "explicit_fail" for e in reply["entries"])
    assert [j["id"] for j in d.ok({"cmd": "Dlq", "queue": "q", "count": 2})["jobs"]] == ids[:2]


def test_dlq_filter(d: Driver) -> None:
    explicit = d.push()
    d.run_to_dlq()
    exhausted = d.push(maxAttempts=1)
    job_id, token = d.pull_id()
    d.fail(job_id, token)
    by_reason = d.ok({"cmd": "Dlq", "queue": "q", "filter": {"reason": "max_attempts_exceeded"}})
    assert [j["id"] for j in by_reason["jobs"]] == [exhausted]
    paged = d.ok({"cmd": "Dlq", "queue": "q", "filter": {"offset": 1, "limit": 5}})
    assert [j["id"] for j in paged["jobs"]] == [exhausted]
    assert explicit != exhausted


def test_dlq_of_an_unknown_queue(d: Driver) -> None:
    assert d.ok({"cmd": "Dlq", "queue": "ghost"}) == {"ok": True, "jobs": [], "entries": []}


def test_retry_dlq_all(d: Driver) -> None:
    ids = [d.push(data=i, maxAttempts=2) for i in range(3)]
    for t in range(3):
        d.run_to_dlq(at=t)
    reply, mutations = d.run({"cmd": "RetryDlq", "queue": "q"}, 100)
    assert reply == {"ok": True, "count": 3}
    assert kinds(mutations) == ["upd"] * 3
    for job_id in ids:
        job = d.job(job_id)
        assert (job["state"], job["attempts"], job["runAt"]) == ("waiting", 0, 100)
        assert job["failedReason"] is None
    assert d.dlq_ids() == []
    assert d.pull_id(at=100)[0] == ids[0]


def test_retry_dlq_one_job(d: Driver) -> None:
    ids = [d.push(data=i) for i in range(2)]
    for t in range(2):
        d.run_to_dlq(at=t)
    assert d.ok({"cmd": "RetryDlq", "queue": "q", "jobId": ids[1]}) == {"ok": True, "count": 1}
    assert (d.state(ids[0]), d.state(ids[1])) == ("failed", "waiting")
    assert d.ok({"cmd": "RetryDlq", "queue": "q", "jobId": "ghost"}) == {"ok": True, "count": 0}
    assert d.ok({"cmd": "RetryDlq", "queue": "q", "jobId": ids[1]})["count"] == 0


def test_retry_dlq_count(d: Driver) -> None:
    for i in range(3):
        d.push(data=i)
        d.run_to_dlq(at=i)
    assert d.ok({"cmd": "RetryDlq", "queue": "q", "count": 2})["count"] == 2
    assert len(d.dlq_ids()) == 1


def test_retried_job_runs_with_a_fresh_attempt_budget(d: Driver) -> None:
    job_id = d.push(maxAttempts=1)
    _, token = d.pull_id(at=0)
    d.fail(job_id, token, at=0)
    d.ok({"cmd": "RetryDlq", "queue": "q"}, 10)
    _, token = d.pull_id(at=10)
    d.ack(job_id, token, at=11, result="second time")
    assert d.job(job_id)["returnvalue"] == "second time"


def test_purge_dlq(d: Driver) -> None:
    ids = [d.push(data=i) for i in range(2)]
    for t in range(2):
        d.run_to_dlq(at=t)
    waiting = d.push()
    reply, mutations = d.run({"cmd": "PurgeDlq", "queue": "q"}, 10)
    assert reply == {"ok": True, "count": 2}
    assert mutations == [("del", i) for i in ids]
    assert d.state(waiting) == "waiting"
    assert d.ok({"cmd": "PurgeDlq", "queue": "q"})["count"] == 0
    assert d.ok({"cmd": "PurgeDlq", "queue": "ghost"})["count"] == 0


def test_retry_completed_all(d: Driver) -> None:
    ids = [d.push(data=i) for i in range(2)]
    for t in range(2):
        d.run_to_completion(at=t, result=t)
    reply = d.ok({"cmd": "RetryCompleted", "queue": "q"}, 50)
    assert reply == {"ok": True, "count": 2}
    for job_id in ids:
        job = d.job(job_id)
        assert (job["state"], job["returnvalue"], job["completedAt"]) == ("waiting", None, None)
        assert "result" not in d.ok({"cmd": "GetResult", "id": job_id})


def test_retry_completed_one(d: Driver) -> None:
    ids = [d.push(data=i) for i in range(2)]
    for t in range(2):
        d.run_to_completion(at=t)
    assert d.ok({"cmd": "RetryCompleted", "queue": "q", "id": ids[0]})["count"] == 1
    assert (d.state(ids[0]), d.state(ids[1])) == ("waiting", "completed")
    assert d.ok({"cmd": "RetryCompleted", "queue": "q", "id": ids[0]})["count"] == 0
    assert d.ok({"cmd": "RetryCompleted", "queue": "q", "id": "ghost"})["count"] == 0


def test_retry_completed_count(d: Driver) -> None:
    for i in range(3):
        d.push(data=i)
        d.run_to_completion(at=i)
    assert d.ok({"cmd": "RetryCompleted", "queue": "q", "count": 2})["count"] == 2
    assert d.counts()["completed"] == 1


# -- configs -------------------------------------------------------------------------------------


def test_dlq_config_defaults_and_update(d: Driver) -> None:
    assert d.ok({"cmd": "GetDlqConfig", "queue": "q"}) == {"ok": True, "config": DEFAULT_DLQ}
    config = {"autoRetry": True, "maxEntries": 5, "maxAge": 1000.0, "unknownKey": 1}
    reply, mutations = d.run({"cmd": "SetDlqConfig", "queue": "q", "config": config}, 0)
    assert reply == {"ok": True}
    expected = {**DEFAULT_DLQ, "autoRetry": True, "maxEntries": 5, "maxAge": 1000}
    assert mutations == [("queue", "q", {"paused": False, "stall": DEFAULT_STALL, "dlq": expected})]
    assert d.ok({"cmd": "GetDlqConfig", "queue": "q"})["config"] == expected
    assert d.ok({"cmd": "GetDlqConfig", "queue": "other"})["config"] == DEFAULT_DLQ


def test_stall_config_defaults_and_update(d: Driver) -> None:
    assert d.ok({"cmd": "GetStallConfig", "queue": "q"}) == {"ok": True, "config": DEFAULT_STALL}
    config = {"enabled": False, "maxStalls": 7}
    _, mutations = d.run({"cmd": "SetStallConfig", "queue": "q", "config": config}, 0)
    expected = {**DEFAULT_STALL, "enabled": False, "maxStalls": 7}
    assert mutations == [("queue", "q", {"paused": False, "stall": expected, "dlq": DEFAULT_DLQ})]
    assert d.ok({"cmd": "GetStallConfig", "queue": "q"})["config"] == expected


@pytest.mark.parametrize(
    ("cmd", "config", "error"),
    [
        ("SetStallConfig", None, "config must be an object"),
        ("SetStallConfig", [1], "config must be an object"),
        ("SetStallConfig", {"enabled": "yes"}, "config.enabled must be a boolean"),
        ("SetStallConfig", {"enabled": 1}, "config.enabled must be a boolean"),
        ("SetStallConfig", {"maxStalls": "x"}, "config.maxStalls must be a number"),
        ("SetStallConfig", {"stallInterval": -1}, "config.stallInterval must be a number"),
        ("SetStallConfig", {"gracePeriod": True}, "config.gracePeriod must be a number"),
        ("SetDlqConfig", None, "config must be an object"),
        ("SetDlqConfig", {"autoRetry": 1}, "config.autoRetry must be a boolean"),
        ("SetDlqConfig", {"maxEntries": "x"}, "config.maxEntries must be a number"),
        ("SetDlqConfig", {"autoRetryInterval": None}, "config.autoRetryInterval must be a number"),
        ("SetDlqConfig", {"maxAutoRetries": -2}, "config.maxAutoRetries must be a number"),
        ("SetDlqConfig", {"maxAge": "week"}, "config.maxAge must be a number"),
    ],
)
def test_config_errors(d: Driver, cmd: str, config: Any, error: str) -> None:
    command: dict[str, Any] = {"cmd": cmd, "queue": "q"}
    if config is not None:
        command["config"] = config
    assert d.err(command) == error
    getter = "GetStallConfig" if cmd == "SetStallConfig" else "GetDlqConfig"
    default = DEFAULT_STALL if cmd == "SetStallConfig" else DEFAULT_DLQ
    assert d.ok({"cmd": getter, "queue": "q"})["config"] == default


def test_a_bad_key_rejects_the_whole_config(d: Driver) -> None:
    config = {"maxStalls": 9, "enabled": "no"}
    d.err({"cmd": "SetStallConfig", "queue": "q", "config": config})
    assert d.ok({"cmd": "GetStallConfig", "queue": "q"})["config"]["maxStalls"] == 3
