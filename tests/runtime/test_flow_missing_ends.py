"""Flows whose links name jobs that do not exist, on a real server with two shards (issue 26).

A parent waiting for a child that is not there would wait for ever, and a child linked to a
parent that is not there reports to no one: both are refused in bunqueue 2.9's words, whether
the missing end would have lived on the same shard or another. The legacy sequence of
bunqueue-client 0.1.5 (children with parentId "pending", then UpdateParent) still works; its
own test is tests/compat/test_compat_flows.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shardq_harness import ShardqServer, poll_until
from wire_clients import Tcp

from shardq.runtime._routing import shard_of

pytestmark = pytest.mark.timeout(120)
SHARDS = 2


def _queue_on(shard: int, prefix: str) -> str:
    return next(q for q in (f"{prefix}-{i}" for i in range(1000)) if shard_of(q, SHARDS) == shard)


@pytest.fixture(scope="module")
def tcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tcp]:
    data: Path = tmp_path_factory.mktemp("missing-ends") / "data"
    with ShardqServer(data, shards=SHARDS).start() as server:
        conn = Tcp(server.tcp_address)
        try:
            yield conn
        finally:
            conn.close()


def _node(job_id: str, queue: str, **fields: Any) -> dict[str, Any]:
    return {"id": job_id, "queue": queue, "input": {"data": {"n": job_id}, **fields}}


def _absent(tcp: Tcp, *ids: str) -> None:
    for job_id in ids:
        reply = tcp.call({"cmd": "GetJob", "id": job_id})
        assert reply.get("job") is None, (job_id, reply)


@pytest.mark.parametrize("across", [False, True], ids=["one-shard", "two-shards"])
def test_pushf_refuses_a_child_or_parent_outside_its_graph(tcp: Tcp, across: bool) -> None:
    tag = "x" if across else "s"
    parent_q, child_q = _queue_on(0, f"{tag}p"), _queue_on(1 if across else 0, f"{tag}c")
    # The parent waits for a child the graph does not hold: refused, nothing admitted.
    nodes = [
        _node(f"{tag}P1", parent_q, childrenIds=[f"{tag}c1", f"{tag}ghost"]),
        _node(f"{tag}c1", child_q, parentId=f"{tag}P1"),
    ]
    reply = tcp.call({"cmd": "PUSHF", "jobs": nodes})
    assert reply == {"ok": False, "error": f"flow child not found: {tag}ghost"}
    # A child that names a parent not in the graph.
    nodes = [_node(f"{tag}c2", child_q, parentId=f"{tag}nobody"), _node(f"{tag}o", parent_q)]
    reply = tcp.call({"cmd": "PUSHF", "jobs": nodes})
    assert reply == {"ok": False, "error": f"flow parent not found: {tag}nobody"}
    # A listed child that names another parent: the first would wait for it for ever.
    nodes = [
        _node(f"{tag}P3", parent_q, childrenIds=[f"{tag}c3"]),
        _node(f"{tag}Q3", parent_q, childrenIds=[]),
        _node(f"{tag}c3", child_q, parentId=f"{tag}Q3"),
    ]
    reply = tcp.call({"cmd": "PUSHF", "jobs": nodes})
    assert reply == {
        "ok": False,
        "error": f"flow child {tag}c3 does not point back to parent {tag}P3",
    }
    _absent(tcp, f"{tag}P1", f"{tag}c1", f"{tag}c2", f"{tag}o", f"{tag}P3", f"{tag}Q3", f"{tag}c3")
    # The same graph with its ends in place is admitted, and the parent waits for its child.
    nodes = [
        _node(f"{tag}P4", parent_q, childrenIds=[f"{tag}c4"]),
        _node(f"{tag}c4", child_q, parentId=f"{tag}P4"),
    ]
    assert tcp.call({"cmd": "PUSHF", "jobs": nodes})["ok"] is True
    state = tcp.call({"cmd": "GetState", "id": f"{tag}P4"})
    assert state.get("state") == "waiting-children", state


def test_flow_held_is_internal(tcp: Tcp) -> None:
    reply = tcp.call({"cmd": "FlowHeld", "ids": ["anything"]})
    assert reply == {"ok": False, "error": "Unknown command: FlowHeld"}


def test_update_parent_refuses_a_parent_no_shard_holds(tcp: Tcp) -> None:
    child_q, parent_q = _queue_on(0, "uc"), _queue_on(1, "up")
    child = tcp.call({"cmd": "PUSH", "queue": child_q, "data": {}, "parentId": "pending"})
    assert child["ok"] is True, child
    reply = tcp.call({"cmd": "UpdateParent", "childId": child["id"], "parentId": "no-such-job"})
    assert reply == {"ok": False, "error": "Parent job not found: no-such-job"}
    job = tcp.call({"cmd": "GetJob", "id": child["id"]})["job"]
    assert job["parentId"] in (None, "pending"), job  # not linked to the missing parent
    # A parent that exists, on the other shard: linked, and its fan-in counts the child.
    parent = tcp.call({
        "cmd": "PUSH", "queue": parent_q, "data": {}, "childrenIds": [child["id"]],
        "dependsOn": [child["id"]],
    })  # fmt: skip
    assert parent["ok"] is True, parent
    linked = tcp.call({"cmd": "UpdateParent", "childId": child["id"], "parentId": parent["id"]})
    assert linked == {"ok": True}
    pulled = tcp.call({"cmd": "PULL", "queue": child_q, "timeout": 2000})
    assert pulled["job"]["id"] == child["id"]
    assert tcp.call({"cmd": "ACK", "id": child["id"], "result": 7})["ok"] is True

    def released() -> bool:
        return tcp.call({"cmd": "GetState", "id": parent["id"]}).get("state") == "waiting"

    poll_until(released, 20, "the parent released by its child on the other shard")
    values = tcp.call({"cmd": "GetChildrenValues", "id": parent["id"]})
    assert values["data"]["values"] == {child["id"]: 7}


def test_remove_unprocessed_children_ends_the_wait_for_children_that_never_existed(
    tcp: Tcp,
) -> None:
    # PUSH with childrenIds is not checked (docs/protocol.md §20.5): the parent waits for
    # them, one on its own shard's side of the id space and one anywhere.
    parent = tcp.call({
        "cmd": "PUSH", "queue": _queue_on(0, "rp"), "data": {},
        "childrenIds": ["never-1", "never-2"],
    })  # fmt: skip
    assert parent["ok"] is True, parent
    assert tcp.call({"cmd": "GetState", "id": parent["id"]}).get("state") == "waiting-children"
    reply = tcp.call({"cmd": "RemoveUnprocessedChildren", "id": parent["id"]})
    assert reply == {"ok": True}

    def released() -> bool:
        return tcp.call({"cmd": "GetState", "id": parent["id"]}).get("state") == "waiting"

    poll_until(released, 20, "the parent released from children that never existed")
    job = tcp.call({"cmd": "GetJob", "id": parent["id"]})["job"]
    assert not job.get("flowPending"), job


def test_a_child_naming_its_parents_queue_needs_the_parent_there(tcp: Tcp) -> None:
    child_q, parent_q = _queue_on(1, "kc"), _queue_on(0, "kp")
    missing = {"ok": False, "error": "Parent job not found: gone"}
    by_option = {"cmd": "PUSH", "queue": child_q, "data": {}, "parentId": "gone",
                 "parentQueue": parent_q}  # fmt: skip
    assert tcp.call(by_option) == missing
    by_data = {"cmd": "PUSH", "queue": child_q, "parentId": "gone",
               "data": {"__parentId": "gone", "__parentQueue": parent_q}}  # fmt: skip
    assert tcp.call(by_data) == missing
    entries = [{"data": {}}, {"data": {}, "parentId": "gone", "parentQueue": parent_q}]
    assert tcp.call({"cmd": "PUSHB", "queue": child_q, "jobs": entries}) == missing
    assert tcp.call({"cmd": "Count", "queue": child_q})["count"] == 0  # nothing admitted
    # Not checked: a bare forward reference, and bunqueue-client 0.1.5's placeholder.
    bare = tcp.call({"cmd": "PUSH", "queue": child_q, "data": {}, "parentId": "later"})
    assert bare["ok"] is True, bare
    pending = {"cmd": "PUSH", "queue": child_q, "parentId": "pending",
               "data": {"__parentId": "pending", "__parentQueue": parent_q}}  # fmt: skip
    assert tcp.call(pending)["ok"] is True
    # The parent in place, on the other shard: admitted, and the batch too.
    parent = tcp.call({"cmd": "PUSH", "queue": parent_q, "data": {}, "jobId": "gone"})
    assert parent["ok"] is True, parent
    assert tcp.call(by_option)["ok"] is True
    assert tcp.call({"cmd": "PUSHB", "queue": child_q, "jobs": entries})["ok"] is True
    assert tcp.call({"cmd": "Count", "queue": child_q})["count"] == 5


def test_a_parent_waiting_past_the_grace_for_children_never_pushed_fails(tmp_path: Path) -> None:
    env = {"SHARDQ_FLOW_CHILDREN_GRACE_MS": "1000"}
    parent_q, child_q = _queue_on(0, "gp"), _queue_on(1, "gc")
    with ShardqServer(tmp_path / "data", shards=SHARDS, env=env).start() as server:
        conn = Tcp(server.tcp_address)
        try:
            # Children pushed after their parent, within the grace: the parent keeps waiting.
            late = conn.call({"cmd": "PUSH", "queue": parent_q, "data": {}, "jobId": "late",
                              "childrenIds": ["late-1"]})  # fmt: skip
            assert late["ok"] is True, late
            child = conn.call({"cmd": "PUSH", "queue": child_q, "data": {}, "jobId": "late-1",
                               "parentId": "late", "parentQueue": parent_q})  # fmt: skip
            assert child["ok"] is True, child
            # One child never pushed: the parent fails, naming it.
            lost = conn.call({"cmd": "PUSHB", "queue": parent_q, "jobs": [
                {"data": {}}, {"data": {}, "customId": "lost", "childrenIds": ["never-1"]},
            ]})  # fmt: skip
            assert lost["ok"] is True, lost

            def failed() -> dict[str, Any] | None:
                job = conn.call({"cmd": "GetJob", "id": "lost"})["job"]
                return job if job["state"] == "failed" else None

            job = poll_until(failed, 30, "the parent of a child never pushed to fail")
            assert job["failedReason"] == "child never-1 failed: Child job not found: never-1"
            state = conn.call({"cmd": "GetState", "id": "late"})
            assert state["state"] == "waiting-children", state
            pulled = conn.call({"cmd": "PULL", "queue": child_q, "timeout": 2000})
            assert pulled["job"]["id"] == "late-1"
            assert conn.call({"cmd": "ACK", "id": "late-1", "result": 1})["ok"] is True

            def released() -> bool:
                return conn.call({"cmd": "GetState", "id": "late"}).get("state") == "waiting"

            poll_until(released, 20, "the parent whose child came late to be released")
        finally:
            conn.close()


def test_the_watch_is_capped_by_flow_children_watch_max(tmp_path: Path) -> None:
    env = {"SHARDQ_FLOW_CHILDREN_GRACE_MS": "1000", "SHARDQ_FLOW_CHILDREN_WATCH_MAX": "1"}
    queue = _queue_on(0, "cap")
    with ShardqServer(tmp_path / "data", shards=SHARDS, env=env).start() as server:
        conn = Tcp(server.tcp_address)
        try:
            for parent in ("first", "second"):  # the second comes while the first is watched
                pushed = conn.call({"cmd": "PUSH", "queue": queue, "data": {}, "jobId": parent,
                                    "childrenIds": [f"{parent}-never"]})  # fmt: skip
                assert pushed["ok"] is True, pushed

            def state(job_id: str) -> str:
                return str(conn.call({"cmd": "GetState", "id": job_id}).get("state"))

            poll_until(lambda: state("first") == "failed", 30, "the watched parent to fail")
            assert server.wait_for_log("flow parents not watched: flow_children_watch_max reached")
            time.sleep(1.5)  # past the second's grace, had it been watched
            assert state("second") == "waiting-children"
        finally:
            conn.close()
