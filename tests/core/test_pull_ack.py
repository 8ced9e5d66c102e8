"""PULL, PULLB, ACK and ACKB, and the lease fencing rules (docs/protocol.md §6.2)."""

from __future__ import annotations

from typing import Any

import pytest
from engine_driver import Driver, upd_states

FINALIZED = {"ok": True, "data": {"applied": False, "reason": "already-finalized"}}


# -- PULL ----------------------------------------------------------------------------------------


def test_pull_without_owner_has_no_token_key(d: Driver) -> None:
    job_id = d.push()
    reply, mutations = d.run({"cmd": "PULL", "queue": "q"}, 10)
    assert set(reply) == {"ok", "job"}
    job = reply["job"]
    assert job["id"] == job_id
    assert job["startedAt"] == 10 and job["lastHeartbeat"] == 10
    assert upd_states(mutations, job_id) == ["active"]
    assert d.state(job_id) == "active"


def test_pull_with_owner_returns_a_token(d: Driver) -> None:
    job_id = d.push()
    reply = d.ok({"cmd": "PULL", "queue": "q", "owner": "w1"}, 10)
    assert set(reply) == {"ok", "job", "token"}
    assert reply["job"]["id"] == job_id
    assert isinstance(reply["token"], str) and reply["token"]


def test_tokens_are_unique_per_delivery(d: Driver) -> None:
    for _ in range(5):
        d.push()
    tokens = {d.pull(owner="w")[1] for _ in range(5)}
    assert len(tokens) == 5


def test_empty_pull(d: Driver) -> None:
    assert d.ok({"cmd": "PULL", "queue": "q", "owner": "w"}) == {
        "ok": True,
        "job": None,
        "token": None,
    }
    assert d.ok({"cmd": "PULL", "queue": "q"}) == {"ok": True, "job": None}
    assert d.ok({"cmd": "PULLB", "queue": "q", "count": 3}) == {"ok": True, "jobs": []}
    assert d.ok({"cmd": "PULLB", "queue": "q", "count": 3, "owner": "w"}) == {
        "ok": True,
        "jobs": [],
        "tokens": [],
    }


@pytest.mark.parametrize("cmd", ["PULL", "PULLB"])
@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"queue": ""}, "Queue name is required"),
        ({"queue": "a b"}, "Queue name contains invalid characters"),
        ({"queue": "x" * 257}, "Queue name too long (max 256 characters)"),
        ({"timeout": 60_001}, "timeout must be at most 60000"),
        ({"timeout": -1}, "timeout must be at least 0"),
        ({"timeout": "1"}, "timeout must be a number"),
    ],
)
def test_pull_errors(d: Driver, cmd: str, fields: dict[str, Any], error: str) -> None:
    d.push()
    assert d.err({"cmd": cmd, "queue": "q", "count": 1, **fields}) == error
    assert d.counts()["waiting"] == 1


@pytest.mark.parametrize(
    ("count", "error"),
    [
        (0, "count must be at least 1"),
        (-5, "count must be at least 1"),
        (1001, "count must be at most 1000"),
        ("2", "count must be a number"),
        (float("inf"), "count must be a finite number"),
    ],
)
def test_pullb_count_bounds(d: Driver, count: Any, error: str) -> None:
    d.push()
    assert d.err({"cmd": "PULLB", "queue": "q", "count": count}) == error


@pytest.mark.parametrize("count", [1, 1000])
def test_pullb_count_bounds_are_inclusive(d: Driver, count: int) -> None:
    d.push()
    assert len(d.ok({"cmd": "PULLB", "queue": "q", "count": count})["jobs"]) == 1


def test_pullb_tokens_are_aligned_with_jobs(d: Driver) -> None:
    ids = [d.push(data=i) for i in range(3)]
    reply = d.ok({"cmd": "PULLB", "queue": "q", "count": 5, "owner": "w"}, 1)
    assert [j["id"] for j in reply["jobs"]] == ids
    tokens = reply["tokens"]
    assert len(tokens) == 3 and len(set(tokens)) == 3
    # A neighbour's token does not fit; each job's own does.
    assert d.err({"cmd": "ACK", "id": ids[0], "token": tokens[1]}, 2) == (
        f"Invalid or expired lock token for job {ids[0]}"
    )
    for job_id, token in zip(ids, tokens, strict=True):
        d.ack(job_id, token, at=2)
        assert d.state(job_id) == "completed"


def test_pullb_takes_at_most_count(d: Driver) -> None:
    for i in range(5):
        d.push(data=i)
    reply = d.ok({"cmd": "PULLB", "queue": "q", "count": 2})
    assert [j["data"] for j in reply["jobs"]] == [0, 1]
    assert "tokens" not in reply
    assert d.counts()["waiting"] == 3


def test_paused_queue_hands_out_nothing(d: Driver) -> None:
    job_id = d.push()
    d.ok({"cmd": "Pause", "queue": "q"})
    assert d.pull() == (None, None)
    assert d.ok({"cmd": "PULLB", "queue": "q", "count": 5, "owner": "w"})["jobs"] == []
    d.ok({"cmd": "Resume", "queue": "q"})
    assert d.pull_id()[0] == job_id


def test_ttl_expired_job_is_never_delivered(d: Driver) -> None:
    expired = d.push(at=0, ttl=1000)
    fresh = d.push(at=0)
    reply, mutations = d.run({"cmd": "PULL", "queue": "q", "owner": "w"}, 1000)
    assert reply["job"]["id"] == fresh
    assert ("del", expired) in mutations
    assert d.state(expired) == "unknown"
    assert d.pull(at=1000) == (None, None)


def test_ttl_job_is_delivered_before_it_expires(d: Driver) -> None:
    job_id = d.push(at=0, ttl=1000)
    assert d.pull_id(at=999)[0] == job_id


def test_ttl_counts_from_created_at_not_from_the_run_time(d: Driver) -> None:
    d.push(at=0, ttl=1000, delay=1000)
    assert d.pull(at=1000) == (None, None)


def test_pull_of_an_unknown_queue_creates_nothing(d: Driver) -> None:
    assert d.pull(queue="ghost") == (None, None)
    assert "ghost" not in d.ok({"cmd": "ListQueues"})["queues"]


# -- ACK: the happy path -------------------------------------------------------------------------


def test_ack_with_the_current_token_completes(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=1)
    reply, mutations = d.run({"cmd": "ACK", "id": job_id, "token": token, "result": {"n": 1}}, 5)
    assert reply == {"ok": True}
    assert upd_states(mutations, job_id) == ["completed"]
    job = d.job(job_id)
    assert job["state"] == "completed"
    assert job["completedAt"] == 5
    assert job["returnvalue"] == {"n": 1}
    assert d.ok({"cmd": "GetResult", "id": job_id})["result"] == {"n": 1}


def test_ack_without_owner_needs_no_token(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(owner=None)
    d.ack(job_id)
    assert d.state(job_id) == "completed"


def test_ack_remove_on_complete_drops_the_job(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id()
    d.ack(job_id, token, removeOnComplete=True)
    assert ("del", job_id) in d.mutations
    assert d.state(job_id) == "unknown"
    assert d.counts()["completed"] == 0


def test_job_option_remove_on_complete(d: Driver) -> None:
    job_id = d.push(removeOnComplete=True)
    _, token = d.pull_id()
    d.ack(job_id, token)
    assert d.state(job_id) == "unknown"


def test_ack_remove_on_complete_false_overrides_the_job_option(d: Driver) -> None:
    job_id = d.push(removeOnComplete=True)
    _, token = d.pull_id()
    d.ack(job_id, token, removeOnComplete=False)
    assert d.state(job_id) == "completed"


# -- ACK: fencing --------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, ""])
def test_ack_without_token_on_a_leased_job(d: Driver, token: str | None) -> None:
    job_id = d.push()
    d.pull_id()
    cmd: dict[str, Any] = {"cmd": "ACK", "id": job_id}
    if token is not None:
        cmd["token"] = token
    assert d.err(cmd) == f"Lock token required for job {job_id}"
    assert d.state(job_id) == "active"


@pytest.mark.parametrize("cmd", ["ACK", "FAIL"])
def test_wrong_token_is_refused(d: Driver, cmd: str) -> None:
    job_id = d.push()
    d.pull_id()
    error = d.err({"cmd": cmd, "id": job_id, "token": "not-the-token"})
    assert error == f"Invalid or expired lock token for job {job_id}"
    assert d.state(job_id) == "active"


def test_fail_without_token_on_a_leased_job(d: Driver) -> None:
    job_id = d.push()
    d.pull_id()
    assert d.err({"cmd": "FAIL", "id": job_id}) == f"Lock token required for job {job_id}"


@pytest.mark.parametrize("cmd", ["ACK", "FAIL"])
def test_unknown_job(d: Driver, cmd: str) -> None:
    assert d.err({"cmd": cmd, "id": "nope"}) == "Job not found or not in processing state: nope"


@pytest.mark.parametrize("cmd", ["ACK", "FAIL"])
def test_job_that_was_never_pulled(d: Driver, cmd: str) -> None:
    job_id = d.push()
    assert d.err({"cmd": cmd, "id": job_id}) == (
        f"Job not found or not in processing state: {job_id}"
    )
    assert d.state(job_id) == "waiting"


def test_expired_lease_without_a_tick_still_acks(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0, lockTtl=1000)
    d.ack(job_id, token, at=50_000)
    assert d.state(job_id) == "completed"


def test_lapsed_lease_requeued_by_tick_still_acks_while_nobody_holds_it(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0, lockTtl=1000)
    d.tick(1000)
    assert d.state(job_id) == "waiting"
    assert d.job(job_id)["attempts"] == 1
    d.ack(job_id, token, at=1001, result="late")
    job = d.job(job_id)
    assert job["state"] == "completed"
    assert job["returnvalue"] == "late"
    assert d.pull(at=1002) == (None, None)


def test_old_token_is_refused_after_another_worker_took_the_job(d: Driver) -> None:
    job_id = d.push()
    _, old = d.pull_id(at=0, owner="w1", lockTtl=1000)
    d.tick(1000)
    _, new = d.pull_id(at=1001, owner="w2")
    assert new != old
    stale = f"Invalid or expired lock token for job {job_id}"
    assert d.err({"cmd": "ACK", "id": job_id, "token": old}, 1002) == stale
    assert d.err({"cmd": "FAIL", "id": job_id, "token": old}, 1002) == stale
    assert d.state(job_id) == "active"
    d.ack(job_id, new, at=1003, result="w2")
    # The stale worker cannot complete it a second time.
    assert d.err({"cmd": "ACK", "id": job_id, "token": old}, 1004) == stale
    job = d.job(job_id)
    assert job["returnvalue"] == "w2"
    assert job["completedAt"] == 1003


@pytest.mark.parametrize("second_token", ["same", "none"])
def test_duplicate_ack_is_a_no_op(d: Driver, second_token: str) -> None:
    job_id = d.push()
    _, token = d.pull_id()
    d.ack(job_id, token, at=1, result=1)
    again = token if second_token == "same" else None
    reply, mutations = d.run({"cmd": "ACK", "id": job_id, "token": again, "result": 2}, 2)
    assert reply == {"ok": True}
    assert mutations == []
    assert d.job(job_id)["returnvalue"] == 1


def test_duplicate_ack_of_an_unleased_delivery_is_a_no_op(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(owner=None)
    d.ack(job_id, at=1)
    reply, mutations = d.run({"cmd": "ACK", "id": job_id}, 2)
    assert reply == {"ok": True}
    assert mutations == []


def test_late_ack_after_timeout_is_already_finalized(d: Driver) -> None:
    job_id = d.push(timeout=1000)
    _, token = d.pull_id(at=0)
    events, _ = d.tick(1000)
    assert ("timeout", "q", job_id) in events
    job = d.job(job_id, at=1000)
    assert job["state"] == "delayed"
    assert job["attempts"] == 1
    assert job["failedReason"] == "Job timed out after 1000ms"
    reply, mutations = d.run({"cmd": "ACK", "id": job_id, "token": token}, 1001)
    assert reply == FINALIZED
    assert mutations == []
    assert d.state(job_id, at=1001) == "delayed"
    reply, mutations = d.run({"cmd": "FAIL", "id": job_id, "token": token}, 1001)
    assert reply == FINALIZED
    assert mutations == []


def test_timeout_is_not_fired_early(d: Driver) -> None:
    job_id = d.push(timeout=1000)
    _, token = d.pull_id(at=0)
    events, _ = d.tick(999)
    assert ("timeout", "q", job_id) not in events
    d.ack(job_id, token, at=999)
    assert d.state(job_id) == "completed"


def test_timeout_at_the_last_attempt_dead_letters_with_reason_timeout(d: Driver) -> None:
    job_id = d.push(timeout=500, maxAttempts=1)
    _, token = d.pull_id(at=0)
    d.tick(500)
    assert d.state(job_id) == "failed"
    entry = d.ok({"cmd": "Dlq", "queue": "q"})["entries"][0]
    assert entry["reason"] == "timeout"
    assert d.run({"cmd": "ACK", "id": job_id, "token": token}, 501)[0] == FINALIZED


def test_late_ack_after_timeout_of_an_unleased_delivery_is_already_finalized(
    d: Driver,
) -> None:
    job_id = d.push(timeout=1000)
    d.pull_id(at=0, owner=None)
    d.tick(1000)
    reply, mutations = d.run({"cmd": "ACK", "id": job_id}, 1001)
    assert reply == FINALIZED
    assert mutations == []


def test_late_ack_after_a_stall_retry_of_an_unleased_delivery_completes(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(at=0, owner=None)
    for t in range(0, 45_001, 5000):
        d.tick(t)
    job = d.job(job_id, at=45_000)
    assert job["state"] in ("waiting", "delayed")
    assert (job["attempts"], job["stallCount"]) == (1, 1)
    reply, _ = d.run({"cmd": "ACK", "id": job_id, "result": "late"}, 45_001)
    assert reply == {"ok": True}
    assert d.state(job_id) == "completed"


# -- ACKB ----------------------------------------------------------------------------------------


def _pull_three(d: Driver) -> tuple[list[str], list[str]]:
    for i in range(3):
        d.push(data=i)
    reply = d.ok({"cmd": "PULLB", "queue": "q", "count": 3, "owner": "w"})
    return [j["id"] for j in reply["jobs"]], reply["tokens"]


def test_ackb_completes_every_job_with_its_result(d: Driver) -> None:
    ids, tokens = _pull_three(d)
    reply = d.ok({"cmd": "ACKB", "ids": ids, "tokens": tokens, "results": ["a", "b", None]}, 1)
    assert reply == {"ok": True}
    assert [d.state(i) for i in ids] == ["completed"] * 3
    assert [d.ok({"cmd": "GetResult", "id": i}).get("result", "absent") for i in ids] == [
        "a",
        "b",
        None,
    ]


def test_ackb_checks_every_lease_before_applying_anything(d: Driver) -> None:
    ids, tokens = _pull_three(d)
    bad = [tokens[0], "wrong", tokens[2]]
    error = d.err({"cmd": "ACKB", "ids": ids, "tokens": bad})
    assert error == f"Invalid or expired lock token for job {ids[1]}"
    assert [d.state(i) for i in ids] == ["active"] * 3


def test_ackb_missing_token_refuses_the_batch(d: Driver) -> None:
    ids, tokens = _pull_three(d)
    error = d.err({"cmd": "ACKB", "ids": ids, "tokens": [tokens[0], tokens[1], None]})
    assert error == f"Lock token required for job {ids[2]}"
    assert [d.state(i) for i in ids] == ["active"] * 3


def test_ackb_unknown_job_refuses_the_batch(d: Driver) -> None:
    ids, tokens = _pull_three(d)
    error = d.err({"cmd": "ACKB", "ids": [*ids, "ghost"], "tokens": [*tokens, "t"]})
    assert error == "Job not found or not in processing state: ghost"
    assert [d.state(i) for i in ids] == ["active"] * 3


@pytest.mark.parametrize("field", ["tokens", "results", "removeOnCompletes"])
@pytest.mark.parametrize("value", [[None], [None] * 4, "x"])
def test_ackb_length_mismatch(d: Driver, field: str, value: Any) -> None:
    ids, _ = _pull_three(d)
    error = d.err({"cmd": "ACKB", "ids": ids, field: value})
    assert error == f"ACKB {field} length must match ids length"


def test_ackb_ids_must_be_a_list(d: Driver) -> None:
    assert d.err({"cmd": "ACKB", "ids": "x"}) == "ids must be an array"


def test_ackb_remove_on_completes_per_position(d: Driver) -> None:
    ids, tokens = _pull_three(d)
    d.ok({"cmd": "ACKB", "ids": ids, "tokens": tokens, "removeOnCompletes": [True, None, False]})
    assert [d.state(i) for i in ids] == ["unknown", "completed", "completed"]


def test_ackb_reports_retired_deliveries(d: Driver) -> None:
    timed = d.push(data="t", timeout=100)
    plain = d.push(data="p")
    reply = d.ok({"cmd": "PULLB", "queue": "q", "count": 2, "owner": "w"}, 0)
    tokens = reply["tokens"]
    d.tick(100)
    reply = d.ok({"cmd": "ACKB", "ids": [timed, plain], "tokens": tokens}, 101)
    assert reply == {"ok": True, "data": {"ignoredIds": [timed], "ignoredIndices": [0]}}
    assert d.state(plain) == "completed"
    assert d.state(timed, at=101) == "delayed"


def test_ackb_duplicate_ack_is_a_no_op(d: Driver) -> None:
    ids, tokens = _pull_three(d)
    d.ok({"cmd": "ACKB", "ids": ids, "tokens": tokens})
    reply, mutations = d.run({"cmd": "ACKB", "ids": ids, "tokens": tokens}, 1)
    assert reply == {"ok": True}
    assert mutations == []


def test_ackb_without_owner(d: Driver) -> None:
    ids = [d.push() for _ in range(2)]
    d.ok({"cmd": "PULLB", "queue": "q", "count": 2})
    d.ok({"cmd": "ACKB", "ids": ids})
    assert [d.state(i) for i in ids] == ["completed"] * 2
