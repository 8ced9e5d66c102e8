"""Bounded memory and disk: completed jobs past the cap are evicted with their rows; results
past theirs are dropped from memory only."""

from __future__ import annotations

from typing import Any

import pytest
from engine_driver import Driver

from shardq.core import Engine, EngineConfig, Mutation


def _complete(d: Driver, n: int) -> tuple[list[str], list[Mutation]]:
    ids: list[str] = []
    mutations: list[Mutation] = []
    for i in range(n):
        job_id = d.push(data=i, at=i)
        mutations += d.mutations
        _, token = d.pull_id(at=i)
        mutations += d.mutations
        d.ack(job_id, token, at=i, result=i)
        mutations += d.mutations
        ids.append(job_id)
    return ids, mutations


def test_completed_jobs_and_results_are_capped() -> None:
    d = Driver(Engine(EngineConfig(max_completed=5, max_results=3), seed=1))
    ids, mutations = _complete(d, 20)
    assert d.counts()["completed"] == 5
    assert [d.state(i) for i in ids] == ["unknown"] * 15 + ["completed"] * 5
    with_result = [i for i in ids if "result" in d.ok({"cmd": "GetResult", "id": i})]
    assert with_result == ids[-3:]
    assert [d.ok({"cmd": "GetResult", "id": i})["result"] for i in with_result] == [17, 18, 19]
    # Each evicted job's row goes too, oldest first; the held ones keep theirs.
    assert [m[1] for m in mutations if m[0] == "del"] == ids[:15]
    assert sum(1 for j in d.engine.jobs.values() if j.state == "completed") <= 5


def test_ackb_evicts_rows_as_one_ack_at_a_time_would() -> None:
    d = Driver(Engine(EngineConfig(max_completed=3), seed=1))
    ids = [d.push(data=i, at=0) for i in range(10)]
    pulled = d.ok({"cmd": "PULLB", "queue": "q", "count": 10}, at=1)
    assert [j["id"] for j in pulled["jobs"]] == ids
    d.ok({"cmd": "ACKB", "ids": ids}, at=2)
    assert [m[1] for m in d.mutations if m[0] == "del"] == ids[:7]
    assert [d.state(i) for i in ids] == ["unknown"] * 7 + ["completed"] * 3


def test_replaying_the_mutations_keeps_only_the_retained_rows() -> None:
    # What the writer would store: a put, updates and a delete per evicted job.
    d = Driver(Engine(EngineConfig(max_completed=4), seed=1))
    ids, mutations = _complete(d, 12)
    rows: dict[str, str] = {}
    for m in mutations:
        if m[0] == "put":
            rows[m[1]["id"]] = m[1]["state"]
        elif m[0] == "upd" and m[1] in rows:
            rows[m[1]] = m[2].get("state", rows[m[1]])
        elif m[0] == "del":
            rows.pop(m[1], None)
    assert rows == {i: "completed" for i in ids[-4:]}


def test_evicted_completion_still_satisfies_dependencies() -> None:
    d = Driver(Engine(EngineConfig(max_completed=1), seed=1))
    ids, _ = _complete(d, 3)
    assert d.state(ids[0]) == "unknown"
    child = d.push(dependsOn=[ids[0]])
    assert d.state(child) == "waiting"


def test_evicted_custom_id_can_be_pushed_again() -> None:
    d = Driver(Engine(EngineConfig(max_completed=1), seed=1))
    d.push(jobId="j")
    d.run_to_completion()
    d.push(data="other")
    d.run_to_completion()
    assert d.state("j") == "unknown"
    assert d.push(jobId="j") == "j"
    assert d.state("j") == "waiting"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_completed", 0),
        ("max_completed", -1),
        ("max_results", 0),
        ("max_logs_per_job", 0),
        ("default_lock_ttl_ms", 0),
        ("completed_retention_ms", -1),
        ("completed_retention_ms", True),
        ("max_completed", 1.5),
        ("max_completed", "10"),
    ],
)
def test_config_values_must_be_positive_integers(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})


def test_default_lock_ttl_follows_the_config() -> None:
    d = Driver(Engine(EngineConfig(default_lock_ttl_ms=500), seed=1))
    job_id = d.push()
    d.pull_id(at=0)
    d.tick(499)
    assert d.state(job_id) == "active"
    d.tick(500)
    assert d.state(job_id) == "waiting"


def test_completed_jobs_past_the_retention_age_leave_memory_and_disk() -> None:
    d = Driver(Engine(EngineConfig(completed_retention_ms=1000), seed=1))
    early = d.push(at=0)
    d.run_to_completion(at=100)  # completed at 100
    late = d.push(at=500)
    d.run_to_completion(at=600)  # completed at 600
    assert d.engine.next_deadline() == 1100  # the timer that ends the oldest retention
    d.tick(1099)
    assert d.state(early) == "completed"
    d.tick(1100)
    assert [m for m in d.mutations if m[0] == "del"] == [("del", early)]
    assert d.state(early) == "unknown" and d.state(late) == "completed"
    assert d.engine.next_deadline() == 1600
    d.tick(1600)
    assert d.state(late) == "unknown" and d.counts()["completed"] == 0


def test_without_a_retention_age_completed_jobs_stay() -> None:
    d = Driver(Engine(seed=1))
    job_id = d.push(at=0)
    d.run_to_completion(at=100)
    d.tick(10**12)
    assert d.state(job_id) == "completed"
    assert all(m[0] != "del" for m in d.mutations)
