"""Flows in the engine (docs/protocol.md §20): fan-in, policies, the flow commands, the outbox.

One engine stands for one shard: a parent it does not hold is "on another shard", so the
child's notice goes to the outbox, and `FlowNotify` is how the parent's shard receives one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_driver import Driver

from shardq.core import Engine, fold_mutations
from shardq.runtime.frontend._commands import ENGINE_COMMANDS, SHARD_COMMANDS
from shardq.storage import Store


@pytest.fixture
def d() -> Driver:
    return Driver(Engine(seed=7))


def _flow(parent_q: str = "p", child_qs: tuple[str, ...] = ("c", "c"), **opts: Any) -> Any:
    children = [f"c{i}" for i in range(len(child_qs))]
    nodes = [{"id": "P", "queue": parent_q, "input": {"data": {}, "childrenIds": children}}]
    for child_id, queue in zip(children, child_qs, strict=True):
        nodes.append({"id": child_id, "queue": queue,
                      "input": {"data": child_id, "parentId": "P", **opts}})  # fmt: skip
    return {"cmd": "PUSHF", "jobs": nodes}


def _take(d: Driver, queue: str, at: int = 1) -> dict[str, Any]:
    pulled = d.ok({"cmd": "PULL", "queue": queue, "owner": "w"}, at)
    assert pulled["job"] is not None
    return {"id": pulled["job"]["id"], "token": pulled["token"]}


def _ack(d: Driver, queue: str, result: Any, at: int = 2) -> str:
    held = _take(d, queue, at)
    d.ok({"cmd": "ACK", **held, "result": result}, at)
    return str(held["id"])


def _fail(d: Driver, queue: str, at: int = 2) -> str:
    held = _take(d, queue, at)
    d.ok({"cmd": "FAIL", **held, "error": "boom"}, at)
    return str(held["id"])


def _state(d: Driver, job_id: str) -> str:
    return str(d.ok({"cmd": "GetState", "id": job_id})["state"])


def test_pushf_makes_a_waiting_parent_released_by_its_last_child(d: Driver) -> None:
    reply = d.ok(_flow())
    assert [j["id"] for j in reply["data"]["jobs"]] == ["P", "c0", "c1"]
    assert reply["data"]["jobs"][0]["childrenIds"] == ["c0", "c1"]
    assert _state(d, "P") == "waiting-children"
    _ack(d, "c", {"v": 0})
    assert _state(d, "P") == "waiting-children"
    _ack(d, "c", None)
    assert _state(d, "P") == "waiting"
    assert d.ok({"cmd": "GetChildrenValues", "id": "P"}) == {
        "ok": True,
        "data": {"values": {"c0": {"v": 0}, "c1": None}},
    }
    assert d.ok({"cmd": "GetJob", "id": "P"})["job"]["childrenCompleted"] == 2


def test_pushf_is_all_or_nothing(d: Driver) -> None:
    flow = _flow()
    flow["jobs"][2]["input"]["priority"] = "x"
    assert d.err(flow, mutates=True) == "jobs[2]: priority must be a number"
    assert [_state(d, i) for i in ("P", "c0", "c1")] == ["unknown"] * 3
    assert d.err({"cmd": "PUSHF", "jobs": []}) == "jobs must be a non-empty array of flow nodes"
    twice = [{"id": "x", "queue": "q"}, {"id": "x", "queue": "q"}]
    assert d.err({"cmd": "PUSHF", "jobs": twice}) == "jobs[1]: duplicate id x"
    assert d.err({"cmd": "PUSHF", "jobs": [{"id": 3, "queue": "q"}]}) == (
        "jobs[0]: id must be a non-empty string"
    )
    d.ok(_flow())
    assert d.err(_flow()) == "Job already exists: P"


def test_the_legacy_sequence_counts_a_child_that_finished_early(d: Driver) -> None:
    data = {"name": "x", "__parentId": "pending", "__parentQueue": "p"}
    kids = [d.push("c", data=data, parentId="pending") for _ in range(2)]
    early = _ack(d, "c", "first")
    parent = d.push("p", data={}, childrenIds=kids, dependsOn=kids)
    assert _state(d, parent) == "waiting-children"
    for kid in kids:
        d.ok({"cmd": "UpdateParent", "childId": kid, "parentId": parent})
    assert d.ok({"cmd": "GetChildrenValues", "id": parent})["data"]["values"] == {early: "first"}
    late = _ack(d, "c", "second", at=3)
    assert _state(d, parent) == "waiting"
    values = d.ok({"cmd": "GetChildrenValues", "id": parent})["data"]["values"]
    assert values == {early: "first", late: "second"}
    assert d.err({"cmd": "UpdateParent", "childId": "nope", "parentId": parent}) == "Job not found"


@pytest.mark.parametrize(
    ("policy", "parent_state", "failed", "ignored"),
    [
        ("failParentOnFailure", "failed", {"c0": "boom"}, {}),
        ("ignoreDependencyOnFailure", "waiting", {}, {"c0": "boom"}),
        ("removeDependencyOnFailure", "waiting", {}, {}),
        ("continueParentOnFailure", "waiting", {"c0": "boom"}, {}),
        (None, "waiting-children", {"c0": "boom"}, {}),
    ],
)
def test_failure_policies(
    d: Driver, policy: str | None, parent_state: str, failed: dict[str, str], ignored: Any
) -> None:
    opts: dict[str, Any] = {"maxAttempts": 1}
    if policy:
        opts[policy] = True
    d.ok(_flow(child_qs=("c",), **opts))
    _fail(d, "c")
    assert _state(d, "P") == parent_state
    assert d.ok({"cmd": "GetFailedChildrenValues", "id": "P"})["values"] == failed
    assert d.ok({"cmd": "GetIgnoredChildrenFailures", "id": "P"})["values"] == ignored
    if policy == "failParentOnFailure":
        assert d.ok({"cmd": "GetJob", "id": "P"})["job"]["failedReason"] == "child c0 failed: boom"


def test_a_retried_child_that_completes_releases_its_parent(d: Driver) -> None:
    d.ok(_flow(child_qs=("c",), maxAttempts=1))
    _fail(d, "c")
    d.ok({"cmd": "RetryDlq", "queue": "c", "jobId": "c0"}, 3)
    _ack(d, "c", 5, at=4)
    assert _state(d, "P") == "waiting"
    assert d.ok({"cmd": "GetChildrenValues", "id": "P"})["data"]["values"] == {"c0": 5}


def test_unknown_or_plain_jobs_have_empty_children_values(d: Driver) -> None:
    plain = d.push("q")
    for job_id in (plain, "missing"):
        assert d.ok({"cmd": "GetChildrenValues", "id": job_id})["data"] == {"values": {}}
        assert d.ok({"cmd": "GetFailedChildrenValues", "id": job_id})["values"] == {}


def test_move_to_waiting_children(d: Driver) -> None:
    d.ok(_flow(child_qs=("c",)))
    _ack(d, "c", 1)
    held = _take(d, "p", 3)
    assert d.ok({"cmd": "MoveToWaitingChildren", **held}, 4)["data"] == {"moved": False}
    lone = d.push("q")
    assert d.err({"cmd": "MoveToWaitingChildren", "id": lone}) == "Job is not active"
    kid = d.push("c", data={"__parentQueue": "q2"}, parentId="pending")
    parent = d.push("q2", childrenIds=[kid])
    d.ok({"cmd": "PromoteJobs", "queue": "q2"})
    assert _state(d, parent) == "waiting-children"
    assert d.err({"cmd": "MoveToWaitingChildren", "id": "missing"}) == "Job not found"


def test_remove_child_dependency_and_unprocessed_children(d: Driver) -> None:
    d.ok(_flow(child_qs=("c", "c", "c")))
    assert d.ok({"cmd": "RemoveChildDependency", "id": "c0"})["removed"] is True
    assert d.ok({"cmd": "RemoveChildDependency", "id": "c0"})["removed"] is False
    assert _ack(d, "c", 1) == "c0"  # it still runs, for nobody
    held = _take(d, "c", 3)  # c1, active: processed, so it stays
    assert d.ok({"cmd": "GetJob", "id": "P"})["job"]["flowPending"] == ["c1", "c2"]
    d.ok({"cmd": "RemoveUnprocessedChildren", "id": "P"}, 4)
    assert [_state(d, i) for i in ("c1", "c2")] == ["active", "unknown"]
    assert _state(d, "P") == "waiting-children"
    d.ok({"cmd": "ACK", **held, "result": "one"}, 5)
    assert _state(d, "P") == "waiting"
    assert d.ok({"cmd": "GetChildrenValues", "id": "P"})["data"]["values"] == {"c1": "one"}
    assert d.err({"cmd": "RemoveUnprocessedChildren", "id": "nope"}) == "Job not found"


def test_a_notice_for_a_parent_elsewhere_goes_to_the_outbox_in_the_childs_batch(
    d: Driver,
) -> None:
    kid = d.push("c", parentId="far", parentQueue="pq")
    held = _take(d, "c")
    _, muts = d.run({"cmd": "ACK", **held, "result": 9}, 2)
    assert muts[0][0] == "upd" and muts[0][2]["state"] == "completed"
    kind, key, notice = muts[1]
    assert kind == "flow" and key == f"{kid}>far>completed"
    assert notice == {"parent": "far", "pq": "pq", "child": kid, "kind": "completed",
                      "policy": None, "result": 9, "cq": "c"}  # fmt: skip
    assert d.engine.flows.take_new() == [key]
    assert d.engine.flows.acked([key, "unknown"]) == [("flowdel", key)]
    assert d.engine.flows.outbox == {}


def test_a_notice_applies_once_however_often_it_arrives(d: Driver) -> None:
    d.ok(_flow(child_qs=("elsewhere",)))
    d.engine.jobs.pop("c0")  # as if the child lived on another shard
    notice = {"parent": "P", "child": "c0", "kind": "completed", "result": 1, "policy": None}
    for _ in range(3):
        reply = d.ok({"cmd": "FlowNotify", "items": [notice, notice]})
    assert reply["applied"] == 0
    job = d.ok({"cmd": "GetJob", "id": "P"})["job"]
    assert job["childrenCompleted"] == 1 and job["childrenValues"] == {"c0": 1}


def test_the_fan_in_survives_a_replay(d: Driver) -> None:
    d.ok(_flow(child_qs=("c", "c")))
    every: list[Any] = list(d.mutations)
    held = _take(d, "c")
    every += d.mutations
    d.ok({"cmd": "ACK", **held, "result": "r"}, 2)
    every += d.mutations
    records, queues = fold_mutations(every)
    back = Engine(seed=1)
    back.restore(records.values(), queues, 3)
    again = Driver(back)
    assert _state(again, "P") == "waiting-children"
    _ack(again, "c", "s", at=4)
    assert again.ok({"cmd": "GetChildrenValues", "id": "P"})["data"]["values"] == {
        "c0": "r",
        "c1": "s",
    }


def test_the_outbox_is_stored_and_deleted(tmp_path: Path) -> None:
    notice = {"parent": "P", "pq": "p", "child": "c", "kind": "completed", "cq": "c"}
    with Store.open(tmp_path / "db.sqlite") as store:
        store.apply([("flow", "c>P>completed", notice), ("flow", "d>P>completed", notice)])
        assert store.load_flow_outbox() == [notice, notice]
        store.apply([("flowdel", "c>P>completed")])
        assert store.load_flow_outbox() == [notice]
    engine = Engine(seed=1)
    engine.flows.load_outbox([notice])
    assert engine.flows.take_new() == ["c>P>completed"]


def test_clients_cannot_send_the_shards_own_commands() -> None:
    for name in ("FlowNotify", "FlowRelease"):
        assert name not in ENGINE_COMMANDS and name not in SHARD_COMMANDS
    assert {"PUSHF", "UpdateParent", "MoveToWaitingChildren"} <= ENGINE_COMMANDS


def test_pushf_cycles_and_self_parents_are_refused_whole(d: Driver) -> None:
    cycle = {"cmd": "PUSHF", "jobs": [
        {"id": "a", "queue": "q", "input": {"data": 1, "parentId": "b"}},
        {"id": "b", "queue": "q", "input": {"data": 2, "parentId": "a"}},
    ]}  # fmt: skip
    assert d.err(cycle) == "Invalid parentId: dependency cycle: a -> b -> a"
    own = {"cmd": "PUSHF", "jobs": [{"id": "a", "queue": "q", "input": {"parentId": "a"}}]}
    assert d.err(own) == "Invalid parentId: a job cannot be its own parent: a"
    waits = {"cmd": "PUSHF", "jobs": [{"id": "a", "queue": "q", "input": {"dependsOn": ["a"]}}]}
    assert d.err(waits) == "Invalid dependsOn: a job cannot wait for itself: a"
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 0
    d.ok(_flow())  # a parent waiting for its children is no cycle
