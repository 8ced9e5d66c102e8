"""Flows on the real server with four shards: the parent and its children on different shards.

A child's completion reaches its parent through the front end, and exactly once: the fan-in
count (`childrenCompleted`) and the values are right even when the parent's or a child's shard
is SIGKILLed between the child's completion and the parent's acknowledgement.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of

pytestmark = pytest.mark.timeout(240)

Factory = Callable[..., ShardqServer]
SHARDS = 4


def _start(factory: Factory, **kwargs: Any) -> ShardqServer:
    # Four shards on a shared two-core machine can take a while to come up.
    return factory(shards=SHARDS, start=False, **kwargs).start(timeout=90)


@pytest.fixture(scope="module")
def four_shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """One four-shard server for the tests that do not restart the server (a shard SIGKILLed
    by a test is back before it ends): each uses queues of its own (its prefixes) and job ids
    of its own (its `_flow` tag; ids are server-wide). Started once instead of once per
    test; stopped cleanly (exit 0) at the end. Flow notices are resent after 200 ms (the
    default is longer) for the shard-kill tests: a shard killed with notices in flight."""
    data = tmp_path_factory.mktemp("flows") / "data"
    env = {"SHARDQ_FLOW_RESEND_MS": "200"}
    with ShardqServer(data, shards=SHARDS, env=env).start(timeout=90) as server:
        yield server
        assert server.stop() == 0, server.log_tail()


def _queue_on(shard: int, prefix: str) -> str:
    return next(q for q in (f"{prefix}-{i}" for i in range(1000)) if shard_of(q, SHARDS) == shard)


def _work(conn: TcpConnection, queue: str, result: Callable[[dict[str, Any]], Any]) -> str:
    """Pull one job of `queue` and ACK it with `result(job)`; returns its id."""
    pulled = conn.call({"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 5000})
    job = pulled["job"]
    assert job is not None, f"no job on {queue}"
    reply = conn.call({"cmd": "ACK", "id": job["id"], "token": pulled["token"],
                       "result": result(job)})  # fmt: skip
    assert reply["ok"], reply
    return str(job["id"])


def _flow(parent_q: str, child_qs: list[str], tag: str = "", **child_opts: Any) -> dict[str, Any]:
    """A PUSHF of parent `{tag}P` on `parent_q` and children `{tag}c<i>` on `child_qs`."""
    parent = f"{tag}P"
    children = [f"{tag}c{i}" for i in range(len(child_qs))]
    root = {"data": {"p": 1}, "childrenIds": children}
    nodes = [{"id": parent, "queue": parent_q, "input": root}]
    for child_id, queue in zip(children, child_qs, strict=True):
        opts = {"data": {"n": child_id}, "parentId": parent, **child_opts}
        nodes.append({"id": child_id, "queue": queue, "input": opts})
    return {"cmd": "PUSHF", "jobs": nodes}


def _state(conn: TcpConnection, job_id: str) -> str:
    return str(conn.call({"cmd": "GetState", "id": job_id})["state"])


def _served(conn: TcpConnection, queues: list[str]) -> bool:
    """True once every queue's shard answers: a restarted shard reports ready a few
    milliseconds before the front end has linked to it again, and meanwhile its commands
    answer `Shard unavailable`."""
    replies = conn.call_many([{"cmd": "Count", "queue": q} for q in queues], check=False)
    return all(reply.get("ok") for reply in replies)


def test_a_flow_across_four_shards_completes_and_reads_its_childrens_values(
    four_shards: ShardqServer,
) -> None:
    parent_q = _queue_on(0, "fp")
    child_qs = [_queue_on(s, "fc") for s in (1, 2, 3)]
    server = four_shards
    with TcpConnection(*server.tcp_address) as conn:
        reply = conn.call(_flow(parent_q, child_qs, "t"))
        assert reply["ok"], reply
        assert [j["id"] for j in reply["data"]["jobs"]] == ["tP", "tc0", "tc1", "tc2"]
        assert _state(conn, "tP") == "waiting-children"
        for queue in child_qs:
            _work(conn, queue, lambda job: {"from": job["data"]["n"]})
        poll_until(lambda: _state(conn, "tP") == "waiting", 10, "the parent released")
        values = conn.call({"cmd": "GetChildrenValues", "id": "tP"})["data"]["values"]
        assert values == {f"tc{i}": {"from": f"tc{i}"} for i in range(3)}
        assert conn.call({"cmd": "GetJob", "id": "tP"})["job"]["childrenCompleted"] == 3
        _work(conn, parent_q, lambda job: "done")
        assert _state(conn, "tP") == "completed"


def test_the_legacy_sequence_across_shards(four_shards: ShardqServer) -> None:
    """bunqueue-client 0.1.5's order: children first (parent "pending"), the parent with
    childrenIds and dependsOn naming them, then one UpdateParent per child. A child that
    finished before its UpdateParent still counts."""
    parent_q, child_q = _queue_on(2, "lp"), _queue_on(3, "lc")
    server = four_shards
    with TcpConnection(*server.tcp_address) as conn:
        ids = []
        for i in range(2):
            data = {"name": f"c{i}", "__parentId": "pending", "__parentQueue": parent_q}
            ids.append(conn.call({"cmd": "PUSH", "queue": child_q, "data": data,
                                  "parentId": "pending"})["id"])  # fmt: skip
        early = _work(conn, child_q, lambda job: 10)
        parent = conn.call({"cmd": "PUSH", "queue": parent_q, "data": {"name": "p"},
                            "childrenIds": ids, "dependsOn": ids})["id"]  # fmt: skip
        for child in ids:
            assert conn.call({"cmd": "UpdateParent", "childId": child, "parentId": parent})["ok"]
        late = _work(conn, child_q, lambda job: 20)
        poll_until(lambda: _state(conn, parent) == "waiting", 10, "the parent released")
        values = conn.call({"cmd": "GetChildrenValues", "id": parent})["data"]["values"]
        assert values == {early: 10, late: 20}


def test_failure_policies_across_shards(four_shards: ShardqServer) -> None:
    parent_q, child_q = _queue_on(1, "pp"), _queue_on(2, "pc")
    server = four_shards

    def fail_one(conn: TcpConnection) -> None:
        pulled = conn.call({"cmd": "PULL", "queue": child_q, "owner": "w", "timeout": 5000})
        conn.call({"cmd": "FAIL", "id": pulled["job"]["id"], "token": pulled["token"],
                   "error": "boom"})  # fmt: skip

    with TcpConnection(*server.tcp_address) as conn:
        # failParentOnFailure: the parent fails with its child.
        assert conn.call(_flow(parent_q, [child_q], "f", failParentOnFailure=True,
                               maxAttempts=1))["ok"]  # fmt: skip
        fail_one(conn)
        poll_until(lambda: _state(conn, "fP") == "failed", 10, "the parent failed")
        assert "fc0" in conn.call({"cmd": "GetJob", "id": "fP"})["job"]["failedReason"]

        # ignoreDependencyOnFailure: released, and the failure is readable.
        assert conn.call(_flow(parent_q, [child_q], "i", ignoreDependencyOnFailure=True,
                               maxAttempts=1))["ok"]  # fmt: skip
        fail_one(conn)
        poll_until(lambda: _state(conn, "iP") == "waiting", 10, "the parent released")
        ignored = conn.call({"cmd": "GetIgnoredChildrenFailures", "id": "iP"})["values"]
        assert ignored == {"ic0": "boom"}

        # removeDependencyOnFailure: released, and nothing recorded.
        assert conn.call(_flow(parent_q, [child_q], "r", removeDependencyOnFailure=True,
                               maxAttempts=1))["ok"]  # fmt: skip
        fail_one(conn)
        poll_until(lambda: _state(conn, "rP") == "waiting", 10, "the parent released")
        assert conn.call({"cmd": "GetFailedChildrenValues", "id": "rP"})["values"] == {}

        # continueParentOnFailure: released at the first failure, the other child pending.
        assert conn.call(_flow(parent_q, [child_q, child_q], "k",
                               continueParentOnFailure=True, maxAttempts=1))["ok"]  # fmt: skip
        fail_one(conn)
        poll_until(lambda: _state(conn, "kP") == "waiting", 10, "the parent released")
        assert conn.call({"cmd": "GetFailedChildrenValues", "id": "kP"})["values"] == {
            "kc0": "boom"
        }
        _work(conn, child_q, lambda job: 1)

        # No policy: the parent keeps waiting, and GetFailedChildrenValues says why.
        assert conn.call(_flow(parent_q, [child_q], "n", maxAttempts=1))["ok"]
        fail_one(conn)
        poll_until(
            lambda: (
                conn.call({"cmd": "GetFailedChildrenValues", "id": "nP"})["values"]
                == {"nc0": "boom"}
            ),
            10,
            "the failure recorded",
        )
        assert _state(conn, "nP") == "waiting-children"


def test_pushf_refused_on_one_shard_leaves_nothing_anywhere(four_shards: ShardqServer) -> None:
    parent_q, ok_q, bad_q = _queue_on(0, "ap"), _queue_on(1, "ac"), _queue_on(2, "ab")
    server = four_shards
    with TcpConnection(*server.tcp_address) as conn:
        for part in ("xP", "xc0", "xc1"):  # nothing of another test's answers for its ids
            assert _state(conn, part) == "unknown"
        flow = _flow(parent_q, [ok_q, bad_q], "x")
        flow["jobs"][2]["input"]["priority"] = "high"  # refused by bad_q's shard
        reply = conn.call(flow, check=False)
        assert reply["ok"] is False, reply
        assert reply["error"] == "jobs[2]: priority must be a number"
        poll_until(
            lambda: all(_state(conn, i) == "unknown" for i in ("xP", "xc0", "xc1")),
            10,
            "every part cancelled",
        )
        for queue in (parent_q, ok_q, bad_q):
            assert conn.call({"cmd": "Count", "queue": queue})["count"] == 0


def test_remove_unprocessed_children_reaches_other_shards(four_shards: ShardqServer) -> None:
    parent_q = _queue_on(0, "up")
    child_qs = [_queue_on(1, "uc"), _queue_on(2, "uc"), _queue_on(3, "uc")]
    server = four_shards
    with TcpConnection(*server.tcp_address) as conn:
        assert conn.call(_flow(parent_q, child_qs, "u"))["ok"]
        pulled = conn.call({"cmd": "PULL", "queue": child_qs[0], "owner": "w"})  # uc0 runs
        assert conn.call({"cmd": "RemoveUnprocessedChildren", "id": "uP"})["ok"] is True
        states = [_state(conn, c) for c in ("uc0", "uc1", "uc2")]
        assert states == ["active", "unknown", "unknown"]
        assert _state(conn, "uP") == "waiting-children"
        conn.call({"cmd": "ACK", "id": "uc0", "token": pulled["token"], "result": 0})
        poll_until(lambda: _state(conn, "uP") == "waiting", 10, "the parent released")
        values = conn.call({"cmd": "GetChildrenValues", "id": "uP"})["data"]["values"]
        assert values == {"uc0": 0}


@pytest.mark.parametrize("victim", ["parent", "child"])
def test_a_shard_killed_mid_flow_still_counts_each_child_once(
    four_shards: ShardqServer, victim: str
) -> None:
    """SIGKILL the parent's shard (notices in flight, some applied, some not) or a child's
    shard (its outbox not acknowledged yet) while children complete; once the shard is back,
    every child counted exactly once and the values are all there."""
    tag = f"kill-{victim}-"  # each case's own queues and ids on the shared server
    parent_q = _queue_on(0, f"{tag}p")
    child_qs = [_queue_on(s, f"{tag}c") for s in (1, 2, 3)] * 4  # twelve children, three shards
    server = four_shards
    with TcpConnection(*server.tcp_address) as conn:
        assert conn.call(_flow(parent_q, child_qs, tag))["ok"]
        for queue in child_qs[:6]:
            _work(conn, queue, lambda job: job["data"]["n"])
        name = "shard-0" if victim == "parent" else "shard-1"
        old = server.child_pids()[name]
        os.kill(old, signal.SIGKILL)
        for queue in child_qs[6:]:
            if victim == "child" and shard_of(queue, SHARDS) == 1:
                continue  # its shard is down: finished after the restart below
            _work(conn, queue, lambda job: job["data"]["n"])
        server.wait_child_replaced(name, old)
    with TcpConnection(*server.tcp_address) as conn:
        poll_until(lambda: _served(conn, [parent_q, *child_qs]), 10, "every shard linked again")
        for queue in child_qs[6:]:
            if victim == "child" and shard_of(queue, SHARDS) == 1:
                _work(conn, queue, lambda job: job["data"]["n"])
        poll_until(lambda: _state(conn, f"{tag}P") == "waiting", 20, "the parent released",
                   detail=server.log_tail)  # fmt: skip
        job = conn.call({"cmd": "GetJob", "id": f"{tag}P"})["job"]
        assert job["childrenCompleted"] == 12
        values = conn.call({"cmd": "GetChildrenValues", "id": f"{tag}P"})["data"]["values"]
        assert values == {f"{tag}c{i}": f"{tag}c{i}" for i in range(12)}


def test_a_parent_waits_across_a_restart(shardq_server: Factory) -> None:
    parent_q, child_q = _queue_on(3, "rp"), _queue_on(0, "rc")
    server = _start(shardq_server)
    with TcpConnection(*server.tcp_address) as conn:
        flow = _flow(parent_q, [child_q, child_q])
        for node in flow["jobs"]:
            node["input"]["durable"] = True
        assert conn.call(flow)["ok"]
        _work(conn, child_q, lambda job: 1)
        poll_until(
            lambda: conn.call({"cmd": "GetJob", "id": "P"})["job"]["childrenCompleted"] == 1,
            10,
            "the first child counted",
        )
    assert server.stop() == 0
    again = _start(shardq_server)
    with TcpConnection(*again.tcp_address) as conn:
        assert _state(conn, "P") == "waiting-children"
        _work(conn, child_q, lambda job: 2)
        poll_until(lambda: _state(conn, "P") == "waiting", 10, "the parent released")
        values = conn.call({"cmd": "GetChildrenValues", "id": "P"})["data"]["values"]
        assert values == {"c0": 1, "c1": 2}
