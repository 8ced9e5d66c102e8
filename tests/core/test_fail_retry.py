"""FAIL: retry with backoff, dead-lettering, removeOnFail, stack normalisation.

The rules: docs/protocol.md §4.5, §4.10 and §6.5.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_driver import Driver, upd_states

from shardq.core import Engine

HOUR = 3_600_000
SEEDS = range(1, 26)


def _fail_once(d: Driver, at: int, **fields: Any) -> tuple[str, dict[str, Any]]:
    job_id, token = d.pull_id(at=at)
    d.fail(job_id, token, at=at, error="boom", **fields)
    return job_id, d.job(job_id, at=at)


@pytest.mark.parametrize("seed", SEEDS)
def test_exponential_backoff_window(seed: int) -> None:
    d = Driver(Engine(seed=seed))
    d.push(maxAttempts=5, backoff=1000)
    now = 10_000
    for attempts in (1, 2, 3):
        _, job = _fail_once(d, now)
        base = 1000 * 2**attempts
        assert job["state"] == "delayed"
        assert job["attempts"] == attempts
        assert now + base * 0.5 <= job["runAt"] <= now + base * 1.5
        assert d.pull(at=job["runAt"] - 1) == (None, None)
        now = job["runAt"]


@pytest.mark.parametrize("seed", SEEDS)
def test_default_backoff_is_exponential_with_base_1000(seed: int) -> None:
    d = Driver(Engine(seed=seed))
    d.push()
    _, job = _fail_once(d, 0)
    assert 1000 <= job["runAt"] <= 3000


@pytest.mark.parametrize("seed", SEEDS)
def test_exponential_object_form_and_max_delay(seed: int) -> None:
    d = Driver(Engine(seed=seed))
    d.push(maxAttempts=10, backoff={"type": "exponential", "delay": 1000, "maxDelay": 1500})
    now = 0
    for _ in range(4):
        _, job = _fail_once(d, now)
        assert now + 1000 <= job["runAt"] <= now + 1500
        now = job["runAt"]


def test_backoff_is_capped_at_one_hour_by_default() -> None:
    d = Driver(Engine(seed=3))
    d.push(maxAttempts=10, backoff=86_400_000)
    _, job = _fail_once(d, 500)
    assert job["runAt"] == 500 + HOUR


def test_large_attempt_counts_stay_capped() -> None:
    d = Driver(Engine(seed=3))
    d.push(maxAttempts=1000, backoff=1)
    now = 0
    for _ in range(70):
        _, job = _fail_once(d, now)
        assert job["runAt"] - now <= HOUR
        now = job["runAt"]
    assert job["attempts"] == 70


@pytest.mark.parametrize("seed", SEEDS)
def test_fixed_backoff_is_within_twenty_percent(seed: int) -> None:
    d = Driver(Engine(seed=seed))
    d.push(maxAttempts=5, backoff={"type": "fixed", "delay": 1000})
    now = 0
    for _ in range(3):
        _, job = _fail_once(d, now)
        assert now + 800 <= job["runAt"] <= now + 1200
        now = job["runAt"]


@pytest.mark.parametrize("seed", SEEDS)
def test_fixed_backoff_respects_max_delay(seed: int) -> None:
    d = Driver(Engine(seed=seed))
    d.push(backoff={"type": "fixed", "delay": 1000, "maxDelay": 900})
    _, job = _fail_once(d, 0)
    assert 800 <= job["runAt"] <= 900


def test_zero_backoff_retries_at_once(d: Driver) -> None:
    job_id = d.push(backoff=0)
    _, job = _fail_once(d, 100)
    assert job["state"] == "waiting"
    assert job["runAt"] == 100
    assert d.pull_id(at=100)[0] == job_id


def test_retry_keeps_the_error_and_stack(d: Driver) -> None:
    d.push()
    job_id, token = d.pull_id(at=0)
    d.fail(job_id, token, at=0, error="bad thing", stack=["line 1", "line 2"])
    job = d.job(job_id)
    assert job["failedReason"] == "bad thing"
    assert job["stacktrace"] == ["line 1", "line 2"]


def test_attempts_never_exceed_max_attempts(d: Driver) -> None:
    job_id = d.push(maxAttempts=3, backoff=0)
    for n in range(1, 4):
        _, token = d.pull_id(at=n)
        d.fail(job_id, token, at=n, error=f"try {n}")
        assert d.job(job_id)["attempts"] == n
    job = d.job(job_id)
    assert job["state"] == "failed"
    assert job["attempts"] == 3
    assert job["failedReason"] == "try 3"
    entry = d.ok({"cmd": "Dlq", "queue": "q"})["entries"][0]
    assert entry["reason"] == "max_attempts_exceeded"
    assert entry["error"] == "try 3"
    assert d.pull(at=10) == (None, None)
    assert d.err({"cmd": "FAIL", "id": job_id}, 11) == (
        f"Job not found or not in processing state: {job_id}"
    )


def test_max_attempts_one_dead_letters_on_the_first_failure(d: Driver) -> None:
    d.push(maxAttempts=1)
    job_id, job = _fail_once(d, 0)
    assert job["state"] == "failed"
    assert d.dlq_ids() == [job_id]


def test_unrecoverable_goes_to_the_dlq_at_once(d: Driver) -> None:
    d.push(maxAttempts=5)
    job_id, token = d.pull_id(at=7)
    reply, mutations = d.run(
        {"cmd": "FAIL", "id": job_id, "token": token, "error": "nope", "unrecoverable": True}, 9
    )
    assert reply == {"ok": True}
    assert upd_states(mutations, job_id) == ["failed"]
    job = d.job(job_id)
    assert job["state"] == "failed"
    assert job["attempts"] == 1
    entry = d.ok({"cmd": "Dlq", "queue": "q"})["entries"][0]
    assert entry["reason"] == "explicit_fail"
    assert entry["error"] == "nope"
    assert entry["enteredAt"] == 9
    assert entry["retryCount"] == 0
    assert entry["expiresAt"] == 9 + 604_800_000
    assert entry["attempts"] == [
        {
            "attempt": 1,
            "startedAt": 7,
            "failedAt": 9,
            "reason": "explicit_fail",
            "error": "nope",
            "duration": 2,
        }
    ]
    assert entry["job"]["id"] == job_id


def test_failed_job_events(d: Driver) -> None:
    d.push(maxAttempts=1)
    job_id, token = d.pull_id()
    d.fail(job_id, token)
    assert ("dead", "q", job_id) in d.events


@pytest.mark.parametrize("where", ["job", "command"])
def test_remove_on_fail_drops_the_job(d: Driver, where: str) -> None:
    opts = {"removeOnFail": True} if where == "job" else {}
    job_id = d.push(maxAttempts=1, **opts)
    _, token = d.pull_id()
    extra = {"removeOnFail": True} if where == "command" else {}
    d.fail(job_id, token, **extra)
    assert ("del", job_id) in d.mutations
    assert d.state(job_id) == "unknown"
    assert d.dlq_ids() == []
    assert d.counts()["failed"] == 0


def test_remove_on_fail_waits_for_the_last_attempt(d: Driver) -> None:
    job_id = d.push(maxAttempts=2, removeOnFail=True)
    _, job = _fail_once(d, 0)
    assert job["state"] == "delayed"
    _, token = d.pull_id(at=job["runAt"])
    d.fail(job_id, token, at=job["runAt"])
    assert d.state(job_id) == "unknown"


def test_remove_on_fail_with_unrecoverable(d: Driver) -> None:
    job_id = d.push(maxAttempts=5, removeOnFail=True)
    _, token = d.pull_id()
    d.fail(job_id, token, unrecoverable=True)
    assert d.state(job_id) == "unknown"


def test_stack_keeps_only_strings_trimmed_up_to_the_limit(d: Driver) -> None:
    job_id = d.push(stackTraceLimit=3)
    _, token = d.pull_id()
    stack = ["  first  ", 1, None, "second\n", {"x": 1}, "third", "fourth"]
    d.fail(job_id, token, stack=stack)
    assert d.job(job_id)["stacktrace"] == ["first", "second", "third"]


def test_stack_default_limit_is_ten_lines_from_the_start(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id()
    d.fail(job_id, token, stack=[f"line {i}" for i in range(15)])
    assert d.job(job_id)["stacktrace"] == [f"line {i}" for i in range(10)]


def test_stack_that_is_not_a_list_is_ignored(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id()
    d.fail(job_id, token, stack="not a list")
    assert d.job(job_id)["stacktrace"] is None


def test_non_string_error_is_not_stored(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id()
    d.fail(job_id, token, error={"not": "a string"})
    assert d.job(job_id)["failedReason"] is None


def test_fail_with_an_expired_but_unticked_lease_is_applied(d: Driver) -> None:
    job_id = d.push(maxAttempts=1)
    _, token = d.pull_id(at=0, lockTtl=100)
    d.fail(job_id, token, at=10_000)
    assert d.state(job_id) == "failed"


def test_fail_of_a_requeued_lapsed_delivery_is_not_charged_twice(d: Driver) -> None:
    job_id = d.push(maxAttempts=5)
    _, token = d.pull_id(at=0, lockTtl=100)
    d.tick(100)
    assert d.job(job_id)["attempts"] == 1
    reply, mutations = d.run({"cmd": "FAIL", "id": job_id, "token": token}, 101)
    assert reply["ok"] is True
    assert mutations == []
    assert d.job(job_id)["attempts"] == 1
