"""Custom-id idempotency and uniqueKey deduplication (docs/protocol.md §4.7)."""

from __future__ import annotations

import pytest
from engine_driver import Driver, kinds

from shardq.core import job_id_of

DUP_EXTENDED = "Duplicate unique_key (extended TTL)"


def _count(d: Driver, queue: str = "q") -> int:
    counts = d.counts(queue)
    return sum(v for k, v in counts.items() if k not in ("prioritized", "paused"))


# -- custom ids ----------------------------------------------------------------------------------


def test_same_job_id_twice_is_one_job(d: Driver) -> None:
    assert d.push(jobId="j", data=1) == "j"
    reply, mutations = d.run({"cmd": "PUSH", "queue": "q", "jobId": "j", "data": 2}, 5)
    assert reply == {"ok": True, "id": "j"}
    assert mutations == []
    assert _count(d) == 1
    assert d.job("j")["data"] == 1


def test_same_job_id_while_active(d: Driver) -> None:
    d.push(jobId="j")
    _, token = d.pull_id()
    reply, mutations = d.run({"cmd": "PUSH", "queue": "q", "jobId": "j", "data": {}}, 5)
    assert reply["id"] == "j"
    assert mutations == []
    assert d.state("j") == "active"
    d.ack("j", token)


@pytest.mark.parametrize("state", ["delayed", "waiting-children"])
def test_same_job_id_while_queued(d: Driver, state: str) -> None:
    if state == "delayed":
        d.push(jobId="j", delay=1000)
    else:
        d.push(jobId="j", dependsOn=[d.push(queue="other")])
    assert d.run({"cmd": "PUSH", "queue": "q", "jobId": "j", "data": {}}, 5)[1] == []
    assert d.state("j") == state


def test_job_id_is_broker_wide(d: Driver) -> None:
    d.push(queue="a", jobId="j")
    assert d.push(queue="b", jobId="j") == "j"
    assert d.job("j")["queue"] == "a"
    assert _count(d, "b") == 0


def test_completed_job_id_starts_a_new_generation(d: Driver) -> None:
    d.push(jobId="j", data="first")
    d.run_to_completion(result="r1")
    reply, mutations = d.run({"cmd": "PUSH", "queue": "q", "jobId": "j", "data": "second"}, 10)
    assert reply == {"ok": True, "id": "j"}
    assert kinds(mutations) == ["del", "put"]
    # A custom-id job's row key names its queue too (see shardq/core/_mutations.py).
    assert mutations[0] == ("del", "j\x1fq")
    assert mutations[1][1]["id"] == "j" and mutations[1][1]["state"] == "waiting"
    job = d.job("j")
    assert (job["data"], job["state"], job["returnvalue"], job["attempts"]) == (
        "second",
        "waiting",
        None,
        0,
    )
    assert "result" not in d.ok({"cmd": "GetResult", "id": "j"})
    assert d.counts()["completed"] == 0
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 1


def test_dead_lettered_job_id_starts_a_new_generation(d: Driver) -> None:
    d.push(jobId="j", data="first")
    d.run_to_dlq()
    _, mutations = d.run({"cmd": "PUSH", "queue": "q", "jobId": "j", "data": "second"}, 10)
    assert kinds(mutations) == ["del", "put"]
    assert d.dlq_ids() == []
    assert d.state("j") == "waiting"
    assert d.job("j")["failedReason"] is None


def test_new_generation_is_delivered_and_fenced_afresh(d: Driver) -> None:
    d.push(jobId="j")
    _, old = d.pull_id()
    d.ack("j", old)
    d.push(jobId="j")
    _, new = d.pull_id(at=1)
    assert d.err({"cmd": "ACK", "id": "j", "token": old}, 2) == (
        "Invalid or expired lock token for job j"
    )
    d.ack("j", new, at=3)


def test_pushb_custom_id_generation(d: Driver) -> None:
    d.pushb([{"data": 1, "customId": "c"}])
    d.run_to_completion()
    reply, mutations = d.run(
        {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": 2, "customId": "c"}]}, 5
    )
    assert reply == {"ok": True, "ids": ["c"]}
    assert kinds(mutations) == ["del", "put"]


def test_get_job_by_custom_id_follows_the_generation(d: Driver) -> None:
    d.push(jobId="j", data=1)
    d.run_to_completion()
    d.push(jobId="j", data=2)
    job = d.ok({"cmd": "GetJobByCustomId", "customId": "j"})["job"]
    assert (job["data"], job["state"]) == (2, "waiting")


# -- uniqueKey -----------------------------------------------------------------------------------


def test_unique_key_returns_the_owner(d: Driver) -> None:
    owner = d.push(uniqueKey="k", data=1)
    reply, mutations = d.run({"cmd": "PUSH", "queue": "q", "uniqueKey": "k", "data": 2}, 5)
    assert reply == {"ok": True, "id": owner}
    assert mutations == []
    assert _count(d) == 1
    assert d.job(owner)["uniqueKey"] == "k"


def test_unique_key_while_the_owner_is_active(d: Driver) -> None:
    owner = d.push(uniqueKey="k")
    d.pull_id()
    assert d.push(uniqueKey="k") == owner


def test_unique_key_is_per_queue(d: Driver) -> None:
    a = d.push(queue="a", uniqueKey="k")
    b = d.push(queue="b", uniqueKey="k")
    assert a != b


def test_unique_key_is_released_when_the_owner_completes(d: Driver) -> None:
    owner = d.push(uniqueKey="k")
    d.run_to_completion()
    successor = d.push(uniqueKey="k")
    assert successor != owner
    assert d.state(successor) == "waiting"


def test_unique_key_is_released_when_the_owner_dead_letters(d: Driver) -> None:
    owner = d.push(uniqueKey="k")
    d.run_to_dlq()
    assert d.push(uniqueKey="k") != owner


def test_unique_key_is_released_when_the_owner_is_removed(d: Driver) -> None:
    owner = d.push(uniqueKey="k")
    d.ok({"cmd": "Cancel", "id": owner})
    assert d.push(uniqueKey="k") != owner


def test_unique_key_ttl_lapses(d: Driver) -> None:
    owner = d.push(at=0, uniqueKey="k", dedup={"ttl": 1000})
    assert d.push(at=999, uniqueKey="k", dedup={"ttl": 1000}) == owner
    successor = d.push(at=1000, uniqueKey="k", dedup={"ttl": 1000})
    assert successor != owner
    assert _count(d) == 2


def test_unique_key_extend(d: Driver) -> None:
    owner = d.push(at=0, uniqueKey="k", dedup={"ttl": 1000})
    reply, mutations = d.run(
        {
            "cmd": "PUSH",
            "queue": "q",
            "data": {},
            "uniqueKey": "k",
            "dedup": {"ttl": 1000, "extend": True},
        },
        900,
    )
    assert reply == {"ok": True, "id": owner}
    assert mutations == [("upd", owner, {"dedupUntil": 1900})]
    # Without the extension the key would have lapsed at 1000.
    assert d.push(at=1500, uniqueKey="k") == owner
    assert d.push(at=1900, uniqueKey="k") != owner


def test_unique_key_extend_with_an_active_owner(d: Driver) -> None:
    owner = d.push(at=0, uniqueKey="k", dedup={"ttl": 1000})
    d.pull_id(at=0)
    reply, _ = d.run(
        {
            "cmd": "PUSH",
            "queue": "q",
            "data": {},
            "uniqueKey": "k",
            "dedup": {"ttl": 1000, "extend": True},
        },
        500,
    )
    assert reply == {"ok": False, "error": DUP_EXTENDED}
    assert d.state(owner) == "active"
    assert _count(d) == 1


def test_unique_key_replace_of_a_queued_owner(d: Driver) -> None:
    owner = d.push(uniqueKey="k", data="old")
    reply, mutations = d.run(
        {
            "cmd": "PUSH",
            "queue": "q",
            "data": "new",
            "uniqueKey": "k",
            "dedup": {"replace": True},
        },
        5,
    )
    successor = reply["id"]
    assert successor != owner
    assert kinds(mutations) == ["del", "put"]
    assert mutations[0] == ("del", owner)
    assert d.state(owner) == "unknown"
    assert d.job(successor)["data"] == "new"
    assert _count(d) == 1
    assert d.push(uniqueKey="k") == successor


def test_unique_key_replace_with_an_active_owner_admits_a_successor(d: Driver) -> None:
    owner = d.push(uniqueKey="k", data="old")
    _, token = d.pull_id()
    successor = d.push(uniqueKey="k", data="new", dedup={"replace": True})
    assert successor != owner
    assert d.state(owner) == "active"
    assert d.state(successor) == "waiting"
    d.ack(owner, token)
    assert d.state(owner) == "completed"
    # The key moved to the successor; the old owner's completion did not release it.
    assert d.push(uniqueKey="k") == successor


def test_unique_key_replace_refused_when_live_jobs_depend_on_the_owner(d: Driver) -> None:
    owner = d.push(uniqueKey="k")
    child = d.push(dependsOn=[owner])
    error = d.err(
        {"cmd": "PUSH", "queue": "q", "data": {}, "uniqueKey": "k", "dedup": {"replace": True}}
    )
    assert error == f"Cannot replace deduplicated job {owner} because live jobs depend on it"
    assert d.state(owner) == "waiting"
    assert d.state(child) == "waiting-children"


def test_unique_key_replace_ignores_dependents_that_are_gone(d: Driver) -> None:
    owner = d.push(uniqueKey="k")
    child = d.push(dependsOn=[owner])
    d.ok({"cmd": "Cancel", "id": child})
    reply, _ = d.run(
        {"cmd": "PUSH", "queue": "q", "data": {}, "uniqueKey": "k", "dedup": {"replace": True}},
        1,
    )
    assert reply["ok"] is True
    assert reply["id"] != owner


def test_custom_id_is_checked_before_the_unique_key(d: Driver) -> None:
    d.push(jobId="j", uniqueKey="k")
    assert d.push(jobId="j", uniqueKey="other") == "j"
    assert d.push(jobId="x", uniqueKey="k") == "j"
    assert d.state("x") == "unknown"


def test_custom_id_rows_are_keyed_by_queue_and_plain_ids_by_id(d: Driver) -> None:
    _, muts = d.run({"cmd": "PUSH", "queue": "qa", "jobId": "order-7", "data": 1}, 1)
    assert muts[0][1]["id"] == "order-7" and muts[0][1]["rowKey"] == "order-7\x1fqa"
    job_id, token = d.pull_id(queue="qa", at=2)
    _, muts = d.run({"cmd": "ACK", "id": job_id, "token": token}, 3)
    assert muts[0][:2] == ("upd", "order-7\x1fqa")
    assert job_id_of(muts[0][1]) == "order-7"
    plain = d.push(queue="qa")
    _, muts = d.run({"cmd": "Cancel", "id": plain}, 4)
    assert muts == [("del", plain)] and job_id_of(plain) == plain
