"""Job mutation (docs/protocol.md §8): cancel, discard, promote, moves, priority, delay, logs."""

from __future__ import annotations

from typing import Any

import pytest
from engine_driver import Driver, kinds, upd_states

from shardq.core import Engine, EngineConfig


def _in_state(d: Driver, state: str) -> str:
    """A job in `state` (public name), in queue "q"."""
    if state == "waiting":
        return d.push()
    if state == "prioritized":
        return d.push(priority=3)
    if state == "delayed":
        return d.push(delay=60_000)
    if state == "waiting-children":
        return d.push(dependsOn=[d.push(queue="other")])
    job_id = d.push(queue="solo")
    if state == "active":
        d.pull_id(queue="solo")
    elif state == "completed":
        d.run_to_completion(queue="solo")
    elif state == "failed":
        d.run_to_dlq(queue="solo")
    assert d.state(job_id) == state
    return job_id


# -- Cancel --------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["waiting", "prioritized", "delayed", "waiting-children"])
def test_cancel_removes_a_queued_job(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    reply, mutations = d.run({"cmd": "Cancel", "id": job_id}, 1)
    assert reply == {"ok": True}
    assert mutations == [("del", job_id)]
    assert d.state(job_id) == "unknown"
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 0


@pytest.mark.parametrize("state", ["active", "completed", "failed"])
def test_cancel_refuses_other_states(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    assert d.err({"cmd": "Cancel", "id": job_id}) == "Job not found or cannot be cancelled"
    assert d.state(job_id) == state


def test_cancel_unknown(d: Driver) -> None:
    assert d.err({"cmd": "Cancel", "id": "ghost"}) == "Job not found or cannot be cancelled"


def test_cancelled_job_is_never_delivered(d: Driver) -> None:
    job_id = d.push()
    other = d.push()
    d.ok({"cmd": "Cancel", "id": job_id})
    assert d.pull_id()[0] == other
    assert d.pull() == (None, None)


# -- Discard -------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["waiting", "delayed", "waiting-children"])
def test_discard_moves_a_queued_job_to_the_dlq(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    reply, mutations = d.run({"cmd": "Discard", "id": job_id}, 5)
    assert reply == {"ok": True}
    assert upd_states(mutations, job_id) == ["failed"]
    assert d.state(job_id) == "failed"
    entry = d.ok({"cmd": "Dlq", "queue": "q"})["entries"][0]
    assert entry["reason"] == "explicit_fail"
    assert d.job(job_id)["failedReason"] == "discarded"


def test_discard_of_a_leased_job_needs_its_token(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id()
    assert d.err({"cmd": "Discard", "id": job_id}) == f"Lock token required for job {job_id}"
    error = d.err({"cmd": "Discard", "id": job_id, "token": "bad"})
    assert error == f"Invalid or expired lock token for job {job_id}"
    d.ok({"cmd": "Discard", "id": job_id, "token": token})
    assert d.state(job_id) == "failed"
    assert d.pull() == (None, None)


def test_discard_ignores_remove_on_fail(d: Driver) -> None:
    job_id = d.push(removeOnFail=True)
    d.ok({"cmd": "Discard", "id": job_id})
    assert d.state(job_id) == "failed"


@pytest.mark.parametrize("state", ["completed", "failed"])
def test_discard_refuses_finished_jobs(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    assert d.err({"cmd": "Discard", "id": job_id}) == "Job not found"


def test_discard_unknown(d: Driver) -> None:
    assert d.err({"cmd": "Discard", "id": "ghost"}) == "Job not found"


# -- Promote and PromoteJobs ---------------------------------------------------------------------


def test_promote_makes_a_delayed_job_ready(d: Driver) -> None:
    job_id = d.push(at=0, delay=60_000)
    reply, mutations = d.run({"cmd": "Promote", "id": job_id}, 10)
    assert reply == {"ok": True}
    assert upd_states(mutations, job_id) == ["waiting"]
    job = d.job(job_id)
    assert job["state"] == "waiting"
    assert job["runAt"] == 10
    assert d.pull_id(at=10)[0] == job_id


@pytest.mark.parametrize("state", ["waiting", "active", "completed", "failed", "waiting-children"])
def test_promote_refuses_jobs_that_are_not_delayed(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    assert d.err({"cmd": "Promote", "id": job_id}) == "Job not found or not delayed"


def test_promote_unknown(d: Driver) -> None:
    assert d.err({"cmd": "Promote", "id": "ghost"}) == "Job not found or not delayed"


def test_promote_jobs_takes_the_earliest_first(d: Driver) -> None:
    late = d.push(at=0, delay=3000)
    early = d.push(at=0, delay=1000)
    middle = d.push(at=0, delay=2000)
    assert d.ok({"cmd": "PromoteJobs", "queue": "q", "count": 2}, 10) == {"ok": True, "count": 2}
    assert (d.state(early), d.state(middle), d.state(late)) == ("waiting", "waiting", "delayed")


def test_promote_jobs_defaults_to_all(d: Driver) -> None:
    for i in range(5):
        d.push(delay=1000 + i)
    d.push()
    assert d.ok({"cmd": "PromoteJobs", "queue": "q"})["count"] == 5
    assert d.counts()["delayed"] == 0


def test_promote_jobs_of_an_unknown_queue(d: Driver) -> None:
    assert d.ok({"cmd": "PromoteJobs", "queue": "ghost"}) == {"ok": True, "count": 0}


# -- MoveToWait ----------------------------------------------------------------------------------


def test_move_to_wait_from_active(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0)
    # bunqueue 2.9.5 answers with the lease errors (checked against a live server).
    assert d.err({"cmd": "MoveToWait", "id": job_id}) == f"Lock token required for job {job_id}"
    error = d.err({"cmd": "MoveToWait", "id": job_id, "token": "bad"})
    assert error == f"Invalid or expired lock token for job {job_id}"
    _, mutations = d.run({"cmd": "MoveToWait", "id": job_id, "token": token}, 5)
    assert upd_states(mutations, job_id) == ["waiting"]
    job = d.job(job_id)
    assert job["state"] == "waiting"
    assert job["attempts"] == 0
    # The old lease is gone: the token no longer fences anything.
    assert d.pull_id(at=6)[0] == job_id


def test_move_to_wait_from_active_without_lease(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(owner=None)
    d.ok({"cmd": "MoveToWait", "id": job_id})
    assert d.state(job_id) == "waiting"


def test_move_to_wait_from_delayed_promotes(d: Driver) -> None:
    job_id = d.push(at=0, delay=60_000)
    d.ok({"cmd": "MoveToWait", "id": job_id}, 10)
    assert d.job(job_id)["runAt"] == 10
    assert d.state(job_id) == "waiting"


def test_move_to_wait_from_failed_retries_from_the_dlq(d: Driver) -> None:
    d.push(queue="q", maxAttempts=1)
    job_id, token = d.pull_id()
    d.fail(job_id, token, error="x")
    d.ok({"cmd": "MoveToWait", "id": job_id}, 100)
    job = d.job(job_id)
    assert job["state"] == "waiting"
    assert job["attempts"] == 0
    assert job["failedReason"] is None
    assert d.dlq_ids() == []


@pytest.mark.parametrize("state", ["waiting", "prioritized"])
def test_move_to_wait_of_a_waiting_job_is_a_no_op(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    assert d.run({"cmd": "MoveToWait", "id": job_id}, 1) == ({"ok": True}, [])
    assert d.state(job_id) == state


@pytest.mark.parametrize("state", ["completed", "waiting-children"])
def test_move_to_wait_refuses(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    error = d.err({"cmd": "MoveToWait", "id": job_id})
    assert error == f"Cannot move job from state '{state}' to waiting"


def test_move_to_wait_unknown(d: Driver) -> None:
    assert d.err({"cmd": "MoveToWait", "id": "ghost"}) == "Job not found"


# -- MoveToDelayed -------------------------------------------------------------------------------


def test_move_to_delayed(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0)
    reply, mutations = d.run(
        {"cmd": "MoveToDelayed", "id": job_id, "delay": 5000, "token": token}, 100
    )
    assert reply == {"ok": True}
    assert upd_states(mutations, job_id) == ["delayed"]
    job = d.job(job_id)
    assert (job["state"], job["runAt"], job["attempts"]) == ("delayed", 5100, 0)
    assert d.pull(at=5099) == (None, None)
    assert d.pull_id(at=5100)[0] == job_id


def test_move_to_delayed_with_zero_delay_requeues(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(owner=None)
    d.ok({"cmd": "MoveToDelayed", "id": job_id, "delay": 0}, 10)
    assert d.state(job_id) == "waiting"


def test_move_to_delayed_needs_the_token(d: Driver) -> None:
    job_id = d.push()
    d.pull_id()
    error = d.err({"cmd": "MoveToDelayed", "id": job_id, "delay": 10})
    assert error == f"Lock token required for job {job_id}"
    error = d.err({"cmd": "MoveToDelayed", "id": job_id, "delay": 10, "token": "bad"})
    assert error == f"Invalid or expired lock token for job {job_id}"


# A waiting or prioritized job is delayed instead (test_introspect_commands.py).
@pytest.mark.parametrize("state", ["delayed", "completed", "failed", "waiting-children"])
def test_move_to_delayed_refuses_inactive_jobs(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    error = d.err({"cmd": "MoveToDelayed", "id": job_id, "delay": 10})
    assert error == f"Job is not active (current state: {state})"


def test_move_to_delayed_unknown(d: Driver) -> None:
    assert d.err({"cmd": "MoveToDelayed", "id": "ghost", "delay": 10}) == "Job not found"


@pytest.mark.parametrize(
    ("delay", "error"),
    [(-1, "delay must be at least 0"), ("x", "delay must be a number")],
)
def test_move_to_delayed_bad_delay(d: Driver, delay: Any, error: str) -> None:
    job_id = d.push()
    _, token = d.pull_id()
    assert d.err({"cmd": "MoveToDelayed", "id": job_id, "delay": delay, "token": token}) == error


# -- ChangePriority ------------------------------------------------------------------------------


def test_change_priority_reorders(d: Driver) -> None:
    first = d.push(data="first")
    second = d.push(data="second")
    reply, mutations = d.run({"cmd": "ChangePriority", "id": second, "priority": 10}, 1)
    assert reply == {"ok": True}
    assert mutations == [("upd", second, {"priority": 10})]
    assert d.state(second) == "prioritized"
    assert d.counts()["prioritized"] == 1
    assert d.pull_id()[0] == second
    assert d.pull_id()[0] == first


def test_change_priority_back_to_zero(d: Driver) -> None:
    a = d.push(priority=5)
    b = d.push()
    d.ok({"cmd": "ChangePriority", "id": a, "priority": 0})
    assert d.state(a) == "waiting"
    assert d.counts()["prioritized"] == 0
    assert [d.pull_id()[0], d.pull_id()[0]] == [a, b]


def test_change_priority_of_a_delayed_job_applies_once_due(d: Driver) -> None:
    d.push(at=0, data="plain")
    delayed = d.push(at=0, delay=100)
    d.ok({"cmd": "ChangePriority", "id": delayed, "priority": 9})
    assert d.state(delayed) == "delayed"
    assert d.pull_id(at=100)[0] == delayed


def test_change_priority_with_lifo(d: Driver) -> None:
    d.push(data="a")
    b = d.push(data="b")
    d.ok({"cmd": "ChangePriority", "id": b, "priority": 0, "lifo": True})
    assert d.job(b)["lifo"] is True
    assert d.pull_id()[0] == b


@pytest.mark.parametrize("state", ["active", "completed", "failed"])
def test_change_priority_refuses_jobs_not_in_the_queue(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    error = d.err({"cmd": "ChangePriority", "id": job_id, "priority": 1})
    assert error == "Job not found or not in queue"


@pytest.mark.parametrize("priority", [None, "5", True])
def test_change_priority_needs_a_number(d: Driver, priority: Any) -> None:
    job_id = d.push()
    error = d.err({"cmd": "ChangePriority", "id": job_id, "priority": priority})
    assert error == "Job not found or not in queue"


def test_change_priority_unknown(d: Driver) -> None:
    error = d.err({"cmd": "ChangePriority", "id": "ghost", "priority": 1})
    assert error == "Job not found or not in queue"


# -- ChangeDelay ---------------------------------------------------------------------------------


def test_change_delay_of_a_waiting_job(d: Driver) -> None:
    job_id = d.push(at=0)
    d.ok({"cmd": "ChangeDelay", "id": job_id, "delay": 500}, 100)
    job = d.job(job_id)
    assert (job["state"], job["runAt"]) == ("delayed", 600)
    assert d.pull(at=599) == (None, None)
    assert d.pull_id(at=600)[0] == job_id


def test_change_delay_of_a_delayed_job(d: Driver) -> None:
    job_id = d.push(at=0, delay=10_000)
    d.ok({"cmd": "ChangeDelay", "id": job_id, "delay": 50}, 100)
    assert d.job(job_id)["runAt"] == 150
    assert d.pull_id(at=150)[0] == job_id


def test_change_delay_to_a_later_time(d: Driver) -> None:
    job_id = d.push(at=0, delay=100)
    d.ok({"cmd": "ChangeDelay", "id": job_id, "delay": 10_000}, 50)
    assert d.pull(at=200) == (None, None)
    d.tick(200)
    assert d.state(job_id) == "delayed"
    assert d.engine.next_deadline() == 10_050


def test_change_delay_to_zero_promotes(d: Driver) -> None:
    job_id = d.push(at=0, delay=10_000)
    d.ok({"cmd": "ChangeDelay", "id": job_id, "delay": 0}, 100)
    assert d.state(job_id) == "waiting"


@pytest.mark.parametrize("state", ["active", "completed", "failed", "waiting-children"])
def test_change_delay_refuses(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    error = d.err({"cmd": "ChangeDelay", "id": job_id, "delay": 10})
    assert error == "Job not found or cannot change delay"


@pytest.mark.parametrize("delay", [-1, "x", float("nan")])
def test_change_delay_bad_delay(d: Driver, delay: Any) -> None:
    job_id = d.push()
    error = d.err({"cmd": "ChangeDelay", "id": job_id, "delay": delay})
    assert error == "Job not found or cannot change delay"


def test_change_delay_unknown(d: Driver) -> None:
    error = d.err({"cmd": "ChangeDelay", "id": "ghost", "delay": 1})
    assert error == "Job not found or cannot change delay"


# -- Update --------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["waiting", "delayed", "active", "waiting-children"])
def test_update_replaces_the_data(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    reply, mutations = d.run({"cmd": "Update", "id": job_id, "data": {"v": 2}}, 1)
    assert reply == {"ok": True}
    assert mutations == [("upd", job_id, {"data": {"v": 2}})]
    assert d.job(job_id)["data"] == {"v": 2}


@pytest.mark.parametrize("state", ["completed", "failed"])
def test_update_refuses_finished_jobs(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    error = d.err({"cmd": "Update", "id": job_id, "data": 1})
    assert error == "Job not found or cannot be updated"


def test_update_needs_data(d: Driver) -> None:
    job_id = d.push()
    assert d.err({"cmd": "Update", "id": job_id}) == "Job not found or cannot be updated"
    d.ok({"cmd": "Update", "id": job_id, "data": None})
    assert d.job(job_id)["data"] is None


def test_update_unknown(d: Driver) -> None:
    assert d.err({"cmd": "Update", "id": "ghost", "data": 1}) == (
        "Job not found or cannot be updated"
    )


# -- Progress ------------------------------------------------------------------------------------


def test_progress_of_an_active_job(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(at=0)
    reply, mutations = d.run(
        {"cmd": "Progress", "id": job_id, "progress": 42, "message": "half"}, 10
    )
    assert reply == {"ok": True}
    assert mutations == [("upd", job_id, {"progress": 42, "progressMessage": "half"})]
    assert d.ok({"cmd": "GetProgress", "id": job_id}) == {
        "ok": True,
        "progress": 42,
        "message": "half",
    }
    job = d.job(job_id)
    assert (job["progress"], job["progressMessage"]) == (42, "half")


def test_progress_without_message(d: Driver) -> None:
    job_id = d.push()
    d.pull_id()
    d.ok({"cmd": "Progress", "id": job_id, "progress": 7.5})
    assert d.ok({"cmd": "GetProgress", "id": job_id})["message"] is None


@pytest.mark.parametrize(
    "state", ["waiting", "prioritized", "delayed", "completed", "failed", "waiting-children"]
)
def test_progress_needs_an_active_job(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    error = d.err({"cmd": "Progress", "id": job_id, "progress": 1})
    assert error == f"Job is not active (current state: {state})"


def test_progress_unknown(d: Driver) -> None:
    assert d.err({"cmd": "Progress", "id": "ghost", "progress": 1}) == "Job not found"
    assert d.err({"cmd": "GetProgress", "id": "ghost"}) == "Job not found"


@pytest.mark.parametrize("state", ["waiting", "delayed", "completed", "failed"])
def test_get_progress_needs_an_active_job(d: Driver, state: str) -> None:
    job_id = _in_state(d, state)
    error = d.err({"cmd": "GetProgress", "id": job_id})
    assert error == f"Job is not active (current state: {state})"


def test_get_progress_of_a_fresh_job(d: Driver) -> None:
    job_id = d.push()
    d.pull_id()
    assert d.ok({"cmd": "GetProgress", "id": job_id}) == {
        "ok": True,
        "progress": 0,
        "message": None,
    }


# -- logs ----------------------------------------------------------------------------------------


def test_add_and_get_logs(d: Driver) -> None:
    job_id = d.push()
    reply, mutations = d.run({"cmd": "AddLog", "id": job_id, "message": "one"}, 10)
    assert reply == {"ok": True, "data": {"added": True}}
    assert kinds(mutations) == ["delta"]
    d.ok({"cmd": "AddLog", "id": job_id, "message": "two", "level": "warn"}, 11)
    d.ok({"cmd": "AddLog", "id": job_id, "message": "three", "level": "bogus"}, 12)
    reply = d.ok({"cmd": "GetLogs", "id": job_id})
    assert reply["data"] == {
        "logs": [
            {"timestamp": 10, "level": "info", "message": "one"},
            {"timestamp": 11, "level": "warn", "message": "two"},
            {"timestamp": 12, "level": "info", "message": "three"},
        ],
        "count": 3,
    }


def test_get_logs_range_is_inclusive(d: Driver) -> None:
    job_id = d.push()
    for i in range(5):
        d.ok({"cmd": "AddLog", "id": job_id, "message": str(i), "level": "error"}, i)
    data = d.ok({"cmd": "GetLogs", "id": job_id, "start": 1, "end": 3})["data"]
    assert [entry["message"] for entry in data["logs"]] == ["1", "2", "3"]
    assert data["count"] == 5


def test_keep_logs_caps_the_log(d: Driver) -> None:
    job_id = d.push(keepLogs=2)
    for i in range(5):
        d.ok({"cmd": "AddLog", "id": job_id, "message": str(i)}, i)
    data = d.ok({"cmd": "GetLogs", "id": job_id})["data"]
    assert [entry["message"] for entry in data["logs"]] == ["3", "4"]
    assert data["count"] == 2


def test_engine_wide_log_cap() -> None:
    d = Driver(Engine(EngineConfig(max_logs_per_job=3), seed=1))
    job_id = d.push()
    for i in range(6):
        d.ok({"cmd": "AddLog", "id": job_id, "message": str(i)})
    logs = d.ok({"cmd": "GetLogs", "id": job_id})["data"]["logs"]
    assert [entry["message"] for entry in logs] == ["3", "4", "5"]


def test_clear_logs(d: Driver) -> None:
    job_id = d.push()
    for i in range(4):
        d.ok({"cmd": "AddLog", "id": job_id, "message": str(i)})
    d.ok({"cmd": "ClearLogs", "id": job_id, "keepLogs": 1})
    logs = d.ok({"cmd": "GetLogs", "id": job_id})["data"]["logs"]
    assert [entry["message"] for entry in logs] == ["3"]
    d.ok({"cmd": "ClearLogs", "id": job_id})
    assert d.ok({"cmd": "GetLogs", "id": job_id})["data"] == {"logs": [], "count": 0}


def test_logs_of_unknown_jobs(d: Driver) -> None:
    assert d.err({"cmd": "AddLog", "id": "ghost", "message": "x"}) == "Job not found"
    assert d.ok({"cmd": "GetLogs", "id": "ghost"})["data"] == {"logs": [], "count": 0}
    assert d.run({"cmd": "ClearLogs", "id": "ghost"}, 0) == ({"ok": True}, [])


def test_logs_survive_completion(d: Driver) -> None:
    job_id = d.push()
    d.ok({"cmd": "AddLog", "id": job_id, "message": "before"})
    d.run_to_completion()
    d.ok({"cmd": "AddLog", "id": job_id, "message": "after"})
    assert d.ok({"cmd": "GetLogs", "id": job_id})["data"]["count"] == 2
