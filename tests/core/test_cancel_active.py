"""`Cancel {active: true}` (docs/protocol.md §8): an active job is dead-lettered at once, not
retried, and a notice names the connection that holds it; without `active`, bunqueue's
refusal stands."""

from __future__ import annotations

from engine_driver import Driver


def test_an_active_job_is_dead_lettered_and_its_connection_told(d: Driver) -> None:
    job_id = d.push(maxAttempts=5)
    _, token = d.pull_id(conn="c7")
    assert d.err({"cmd": "Cancel", "id": job_id}) == "Job not found or cannot be cancelled"
    assert d.state(job_id) == "active"
    reply, _ = d.run({"cmd": "Cancel", "id": job_id, "active": True, "reason": "stop"}, 5)
    assert reply == {"ok": True}
    notices = d.cancels  # the call's own Outcome carries them: nothing stays on the engine
    assert d.state(job_id) == "failed"
    job = d.ok({"cmd": "GetJob", "id": job_id})["job"]
    assert job["failedReason"] == "cancelled: stop" and job["attempts"] <= 1
    entries = d.ok({"cmd": "Dlq", "queue": "q"})["entries"]
    assert [(e["job"]["id"], e["reason"]) for e in entries] == [(job_id, "cancelled")]
    assert notices == [{"conn": "c7", "jobId": job_id, "queue": "q", "reason": "cancelled: stop"}]
    # Nothing is delivered again: the job is not retried, and the lease is gone.
    d.tick(10_000_000)
    assert d.state(job_id) == "failed"
    for late in ({"cmd": "ACK", "result": 1}, {"cmd": "FAIL", "error": "x"}):
        message = d.err({**late, "id": job_id, "token": token})
        assert message.startswith("Job not found or not in processing state"), message


def test_queued_and_finished_jobs_with_active(d: Driver) -> None:
    queued = d.push()
    assert d.ok({"cmd": "Cancel", "id": queued, "active": True}) == {"ok": True}
    assert d.cancels == []  # a queued job has no worker to tell
    assert d.state(queued) == "unknown"
    done = d.push(queue="solo")
    d.run_to_completion(queue="solo")
    message = d.err({"cmd": "Cancel", "id": done, "active": True})
    assert message == "Job not found or cannot be cancelled"


def test_a_cancelled_child_fails_its_flow_parent(d: Driver) -> None:
    d.ok({"cmd": "PUSHF", "jobs": [
        {"id": "p", "queue": "q", "input": {"data": {}, "childrenIds": ["c"]}},
        {"id": "c", "queue": "q", "input": {"data": {}, "parentId": "p",
                                            "failParentOnFailure": True}},
    ]})  # fmt: skip
    assert d.pull_id()[0] == "c"
    d.ok({"cmd": "Cancel", "id": "c", "active": True})
    assert d.state("p") == "failed"
    parent = d.ok({"cmd": "GetJob", "id": "p"})["job"]
    assert parent["failedReason"] == "child c failed: cancelled"
