"""Flows whose jobs live on different nodes (docs/cluster.md "Flows across nodes"): three real
`shardq start` nodes on one PostgreSQL database.

A PUSHF whose parent is on node A's queue, its children on node B's and a grandchild on node
C's, pushed through any node, is admitted whole or not at all; workers on any node run the
children, the parent is released once they complete, and its GetChildrenValues has every
child's result. A failing child with failParentOnFailure fails its parent on another node; the
other policies and RemoveChildDependency count across nodes too; bunqueue-client's
FlowProducer (PUSH, then UpdateParent) works through a node that holds none of its queues. The
last test `kill -9`s the children's node mid-flow: the survivors take its partitions and load
the children with their unacknowledged notices, and the flow completes with every result.

Short leases (1500 ms) keep each test to seconds. Deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bunqueue
import psycopg
import pytest
from pg_server import new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, free_port, poll_until

from shardq.client import TcpConnection
from shardq.cluster import partition_of

NEEDS_POSTGRES = True
pytestmark = pytest.mark.timeout(300)
LEASE_MS = 1500
ROUND_S = LEASE_MS / 3000
PARTS = 12
NAMES = ("node-a", "node-b", "node-c")
# A parent whose children no node holds fails after this: a parent whose children another
# node holds must not.
GRACE_MS = 400
# Answers a client retries: a partition being loaded or between owners, or a dead node.
RETRIED = ("Partition unavailable", "Node unavailable", "Node busy", "Shard unavailable")
Nodes = tuple[dict[str, ShardqServer], str]


def _node(tmp: Path, name: str, url: str, shards: int) -> ShardqServer:
    settings = {"SHARDQ_STORAGE_URL": url, "SHARDQ_LEASE_MS": str(LEASE_MS),
                "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name,
                "SHARDQ_MULTI_NODE_PREVIEW": "true", "SHARDQ_FORWARD_TIMEOUT_MS": "2000",
                "SHARDQ_FLOW_RESEND_MS": "300",
                "SHARDQ_FLOW_CHILDREN_GRACE_MS": str(GRACE_MS)}  # fmt: skip
    return ShardqServer(tmp / name, shards=shards, env=settings, http_port=free_port())


def _owners(url: str) -> dict[int, str]:
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT partition, owner FROM partition_leases WHERE expires_at > now()"
        ).fetchall()
    return {int(p): str(o) for p, o in rows}


def _queue_of(url: str, node: str, prefix: str, skip: int = 0) -> str:
    """The `skip`-th queue name `prefix<i>` whose partition `node` holds now."""
    owners = _owners(url)
    names = (f"{prefix}{i}" for i in range(100_000)
             if owners.get(partition_of(f"{prefix}{i}", PARTS)) == node)  # fmt: skip
    for _ in range(skip):
        next(names)
    return next(names)


def _cluster(node: ShardqServer) -> dict[str, Any]:
    with urllib.request.urlopen(f"{node.http_url}/cluster", timeout=10) as reply:
        return json.loads(reply.read())  # type: ignore[no-any-return]


def _served_by_map(nodes: dict[str, ShardqServer], url: str) -> bool:
    """Every node's front end serves by the split map: a `NoForward` connection gets
    `MOVED` for each other node's queue."""
    for here, node in nodes.items():
        with TcpConnection(*node.tcp_address, timeout=15) as conn:
            conn.call({"cmd": "NoForward"})
            for there in nodes:
                if there == here:
                    continue
                queue = _queue_of(url, there, "probe")
                reply = conn.call({"cmd": "Count", "queue": queue}, check=False)
                if not str(reply.get("error", "")).startswith("MOVED "):
                    return False
    return True


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """Nodes a, b (two shards) and c for the module; the last two tests kill C, then B."""
    tmp = tmp_path_factory.mktemp("flows")
    url = new_database("flows")
    nodes = {name: _node(tmp, name, url, 2 if name == "node-b" else 1) for name in NAMES}
    try:
        for node in nodes.values():
            node.start()
        share = {name: PARTS // 3 for name in NAMES}
        poll_until(
            lambda: all(
                {n["id"]: n["partitions"] for n in _cluster(x)["nodes"] if n["alive"]} == share
                for x in nodes.values()
            ),
            8 * ROUND_S + 10,
            "the three nodes to share the partitions",
            detail=lambda: str(_owners(url)),
        )
        poll_until(lambda: _served_by_map(nodes, url), 4 * LEASE_MS / 1000,
                   "every front end to serve by the split map")  # fmt: skip
        yield nodes, url
    finally:
        for node in nodes.values():
            node.close()


def _conn(node: ShardqServer) -> TcpConnection:
    return TcpConnection(*node.tcp_address, timeout=30)


def _call(conn: TcpConnection, cmd: dict[str, Any], wait_s: float = 20.0) -> dict[str, Any]:
    """`cmd`, retried while its answer is one a client retries (a partition moving)."""
    deadline = time.monotonic() + wait_s
    while True:
        reply = conn.call(dict(cmd), check=False)
        if not str(reply.get("error", "")).startswith(RETRIED) or time.monotonic() > deadline:
            return reply
        time.sleep(0.1)


def _state(conn: TcpConnection, job_id: str) -> str:
    return str(_call(conn, {"cmd": "GetState", "id": job_id}).get("state"))


def _work(conn: TcpConnection, queue: str, result: Any = None, fail: bool = False) -> str:
    """Pull one job of `queue` and ACK it (its result: `result`, else `{"from": its id}`), or
    FAIL it; returns its id."""
    pulled = _call(conn, {"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 5000})
    job = pulled.get("job")
    assert job is not None, f"no job on {queue}: {pulled}"
    if fail:
        cmd = {"cmd": "FAIL", "id": job["id"], "token": pulled["token"], "error": "boom"}
    else:
        value = {"from": job["id"]} if result is None else result
        cmd = {"cmd": "ACK", "id": job["id"], "token": pulled["token"], "result": value}
    reply = _call(conn, cmd)
    assert reply["ok"], reply
    return str(job["id"])


def _node_input(parent: str | None = None, children: list[str] | None = None,
                **opts: Any) -> dict[str, Any]:  # fmt: skip
    fields: dict[str, Any] = {"data": {"x": 1}, "maxAttempts": 1, **opts}
    if parent is not None:
        fields["parentId"] = parent
    if children:
        fields["childrenIds"] = children
    return fields


def _tree(tag: str, parent_q: str, child_q: list[str], grand_q: str) -> dict[str, Any]:
    """Parent `{tag}P` on `parent_q`; children `{tag}c<i>` on `child_q`; a grandchild
    `{tag}g` on `grand_q`, the child of `{tag}c0`."""
    kids = [f"{tag}c{i}" for i in range(len(child_q))]
    jobs = [{"id": f"{tag}P", "queue": parent_q, "input": _node_input(children=kids)}]
    for i, (kid, queue) in enumerate(zip(kids, child_q, strict=True)):
        grand = [f"{tag}g"] if i == 0 else None
        jobs.append({"id": kid, "queue": queue, "input": _node_input(f"{tag}P", grand)})
    jobs.append({"id": f"{tag}g", "queue": grand_q, "input": _node_input(f"{tag}c0")})
    return {"cmd": "PUSHF", "jobs": jobs}


def test_a_flow_over_three_nodes_completes_through_any_node(three: Nodes) -> None:
    nodes, url = three
    a, b, c = (nodes[n] for n in NAMES)
    parent_q = _queue_of(url, "node-a", "fp")
    child_q = [_queue_of(url, "node-b", "fc", k) for k in range(3)]  # on B's two shards
    grand_q = _queue_of(url, "node-c", "fg")
    for tag, through in (("x", a), ("y", b), ("z", c)):
        with _conn(through) as conn:
            reply = _call(conn, _tree(tag, parent_q, child_q, grand_q))
        assert reply["ok"], (reply, _cluster(a), parent_q, child_q, grand_q)
        order = [f"{tag}P", *(f"{tag}c{i}" for i in range(3)), f"{tag}g"]
        assert [j["id"] for j in reply["data"]["jobs"]] == order
    with _conn(c) as worker, _conn(a) as reader:
        for tag in "xyz":
            assert _state(reader, f"{tag}P") == "waiting-children"
            assert _state(reader, f"{tag}c0") == "waiting-children"
            assert _state(reader, f"{tag}c1") == "waiting"
        # Workers through C run everything (B's and A's queues forwarded).
        done = {_work(worker, grand_q) for _ in range(3)}
        assert done == {"xg", "yg", "zg"}
        for tag in "xyz":
            poll_until(lambda t=tag: _state(reader, f"{t}c0") == "waiting", 15,
                       f"{tag}c0 released by its grandchild")  # fmt: skip
        ran = {_work(worker, q) for q in child_q for _ in range(3)}
        assert ran == {f"{t}c{i}" for t in "xyz" for i in range(3)}
        for tag in "xyz":
            poll_until(lambda t=tag: _state(reader, f"{t}P") == "waiting", 15,
                       f"{tag}P released by its children")  # fmt: skip
            values = _call(reader, {"cmd": "GetChildrenValues", "id": f"{tag}P"})
            assert values["data"]["values"] == {
                f"{tag}c{i}": {"from": f"{tag}c{i}"} for i in range(3)
            }
            grand = _call(worker, {"cmd": "GetChildrenValues", "id": f"{tag}c0"})
            assert grand["data"]["values"] == {f"{tag}g": {"from": f"{tag}g"}}
            job = _call(worker, {"cmd": "GetJob", "id": f"{tag}P"})["job"]
            assert job["childrenCompleted"] == 3
        assert {_work(worker, parent_q, "parent") for _ in range(3)} == {"xP", "yP", "zP"}
        assert all(_state(reader, f"{t}P") == "completed" for t in "xyz")


def test_a_flow_refused_on_one_node_is_admitted_nowhere(three: Nodes) -> None:
    """Atomic across nodes: a part refused on B (a job id it already holds) leaves nothing of
    the flow on A or C, and the client gets B's error."""
    nodes, url = three
    a, c = nodes["node-a"], nodes["node-c"]
    parent_q = _queue_of(url, "node-a", "rp")
    child_q = _queue_of(url, "node-b", "rc")
    grand_q = _queue_of(url, "node-c", "rg")
    with _conn(c) as conn:
        assert _call(conn, {"cmd": "PUSH", "queue": child_q, "jobId": "taken", "data": {}})["ok"]
        flow = _tree("r", parent_q, [child_q, child_q], grand_q)
        flow["jobs"][2]["id"] = "taken"
        flow["jobs"][0]["input"]["childrenIds"] = ["rc0", "taken"]
        reply = _call(conn, flow)
        assert not reply["ok"] and "already exists" in reply["error"], reply
    with _conn(a) as conn:
        poll_until(lambda: all(_state(conn, j) in ("unknown", "failed") for j in ("rP", "rg",
                   "rc0")), 10, "the admitted parts cancelled")  # fmt: skip
        for queue in (parent_q, grand_q):
            pulled = _call(conn, {"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 0})
            assert pulled.get("job") is None, pulled


def test_failure_policies_and_removed_dependencies_count_across_nodes(three: Nodes) -> None:
    nodes, url = three
    a, b = nodes["node-a"], nodes["node-b"]
    parent_q = _queue_of(url, "node-a", "pp")
    child_q = _queue_of(url, "node-b", "pc")
    with _conn(b) as conn:
        # failParentOnFailure: the child fails on B, its parent on A fails with it.
        flow = {"cmd": "PUSHF", "jobs": [
            {"id": "fP", "queue": parent_q, "input": _node_input(children=["fc"])},
            {"id": "fc", "queue": child_q,
             "input": _node_input("fP", failParentOnFailure=True)},
        ]}  # fmt: skip
        assert _call(conn, flow)["ok"]
        assert _work(conn, child_q, fail=True) == "fc"
        poll_until(lambda: _state(conn, "fP") == "failed", 15, "the parent failed")
        reason = _call(conn, {"cmd": "GetJob", "id": "fP"})["job"].get("failedReason")
        assert "child fc failed" in str(reason), reason
        # ignore, remove, and a dependency removed by hand: the parent runs on the last one.
        flow = {"cmd": "PUSHF", "jobs": [
            {"id": "iP", "queue": parent_q,
             "input": _node_input(children=["ic", "rc", "hc", "ok"])},
            {"id": "ic", "queue": child_q,
             "input": _node_input("iP", ignoreDependencyOnFailure=True)},
            {"id": "rc", "queue": child_q,
             "input": _node_input("iP", removeDependencyOnFailure=True)},
            {"id": "hc", "queue": child_q, "input": _node_input("iP", delay=3_600_000)},
            {"id": "ok", "queue": child_q, "input": _node_input("iP")},
        ]}  # fmt: skip
        assert _call(conn, flow)["ok"]
        removed = _call(conn, {"cmd": "RemoveChildDependency", "id": "hc"})
        assert removed["ok"], removed
        assert _work(conn, child_q, fail=True) == "ic"
        assert _work(conn, child_q, fail=True) == "rc"
        assert _state(conn, "iP") == "waiting-children"
        assert _work(conn, child_q, 7) == "ok"
        poll_until(lambda: _state(conn, "iP") == "waiting", 15, "the parent released")
    with _conn(a) as conn:
        values = _call(conn, {"cmd": "GetChildrenValues", "id": "iP"})["data"]["values"]
        assert values == {"ok": 7}
        ignored = _call(conn, {"cmd": "GetIgnoredChildrenFailures", "id": "iP"})
        assert set(ignored["values"]) == {"ic"}, ignored


def test_remove_unprocessed_children_on_another_node(three: Nodes) -> None:
    """Through C, for a parent on A: its children still queued on B are removed, the one
    running there goes on, and the parent waits for that one only."""
    nodes, url = three
    parent_q = _queue_of(url, "node-a", "up")
    child_q = _queue_of(url, "node-b", "uc")
    kids = ["u0", "u1", "u2"]
    jobs = [{"id": "uP", "queue": parent_q, "input": _node_input(children=kids)}]
    jobs += [{"id": k, "queue": child_q, "input": _node_input("uP")} for k in kids]
    with _conn(nodes["node-c"]) as conn:
        assert _call(conn, {"cmd": "PUSHF", "jobs": jobs})["ok"]
        pulled = _call(conn, {"cmd": "PULL", "queue": child_q, "owner": "w", "timeout": 5000})
        running = pulled["job"]["id"]
        assert _call(conn, {"cmd": "RemoveUnprocessedChildren", "id": "uP"})["ok"] is True
        states = {k: _state(conn, k) for k in kids}
        assert states == {k: "active" if k == running else "unknown" for k in kids}, states
        assert _state(conn, "uP") == "waiting-children"
        ack = {"cmd": "ACK", "id": running, "token": pulled["token"], "result": 0}
        assert _call(conn, ack)["ok"]
        poll_until(lambda: _state(conn, "uP") == "waiting", 15, "the parent released")
        values = _call(conn, {"cmd": "GetChildrenValues", "id": "uP"})["data"]["values"]
        assert values == {running: 0}


def test_peer_requests_are_a_peers_only_and_a_notice_delivered_again_counts_once(
    three: Nodes,
) -> None:
    """A client gets `Peer command: ...` for the peer requests (and a held PUSHF). On a
    peer's link (`NoForward {node}`), a notice sent again, as a stale node's outbox would,
    changes nothing in the parent: its count and values stay as the first delivery left
    them; so does a late failure of a child already counted. A notice for a queue this node
    does not serve is refused, to be sent again to its owner."""
    nodes, url = three
    a = nodes["node-a"]
    parent_q = _queue_of(url, "node-a", "dp")
    child_q = _queue_of(url, "node-b", "dc")
    with _conn(a) as conn:
        for cmd in ({"cmd": "PeerFlowNotify", "queue": parent_q, "items": []},
                    {"cmd": "PeerFlowHeld", "ids": ["x"]},
                    {"cmd": "PeerFlowRelease", "ids": ["x"], "queues": [parent_q]},
                    {"cmd": "PUSHF", "hold": True,
                     "jobs": [{"id": "h", "queue": parent_q, "input": {}}]}):  # fmt: skip
            reply = conn.call(cmd, check=False)
            assert str(reply.get("error", "")).startswith("Peer command: "), reply
        flow = {"cmd": "PUSHF", "jobs": [
            {"id": "dP", "queue": parent_q, "input": _node_input(children=["d0", "d1"])},
            {"id": "d0", "queue": child_q, "input": _node_input("dP")},
            {"id": "d1", "queue": child_q, "input": _node_input("dP")},
        ]}  # fmt: skip
        assert _call(conn, flow)["ok"]
        assert _work(conn, child_q, 5) == "d0"

        def job() -> dict[str, Any]:
            return dict(_call(conn, {"cmd": "GetJob", "id": "dP"})["job"])

        poll_until(lambda: job()["childrenCompleted"] == 1, 15, "d0 counted")
    done = {"parent": "dP", "pq": parent_q, "child": "d0", "cq": child_q, "policy": None}
    again = [{**done, "kind": "completed", "result": 99},
             {**done, "kind": "failed", "reason": "stale", "policy": "fail"}]  # fmt: skip
    with _conn(a) as peer:
        assert peer.call({"cmd": "NoForward", "node": "node-b"})["ok"]
        for _ in range(2):
            reply = peer.call({"cmd": "PeerFlowNotify", "queue": parent_q, "items": again})
            assert reply["ok"] and reply["applied"] == 0, reply
        elsewhere = _queue_of(url, "node-b", "dn")
        refused = peer.call({"cmd": "PeerFlowNotify", "queue": elsewhere, "items": again},
                            check=False)  # fmt: skip
        assert str(refused.get("error", "")).startswith("Partition unavailable"), refused
    with _conn(a) as conn:
        parent = job()
        assert parent["state"] == "waiting-children"
        assert parent["childrenCompleted"] == 1
        values = _call(conn, {"cmd": "GetChildrenValues", "id": "dP"})["data"]["values"]
        assert values == {"d0": 5}
        assert _work(conn, child_q, 6) == "d1"
        poll_until(lambda: _state(conn, "dP") == "waiting", 15, "the parent released")
        values = _call(conn, {"cmd": "GetChildrenValues", "id": "dP"})["data"]["values"]
        assert values == {"d0": 5, "d1": 6}


def test_bunqueue_flow_producer_through_a_node_holding_none_of_its_queues(three: Nodes) -> None:
    """bunqueue-client's FlowProducer: children pushed first (parent "pending"), the parent
    with childrenIds, then UpdateParent per child, all through node C; the parent's queue is
    A's and the children's B's."""
    nodes, url = three
    a, c = nodes["node-a"], nodes["node-c"]
    parent_q = _queue_of(url, "node-a", "bp")
    child_q = _queue_of(url, "node-b", "bc")
    host, port = c.tcp_address
    with bunqueue.FlowProducer(host=host, port=port) as producer:
        tree = producer.add({
            "name": "parent", "queueName": parent_q, "data": {"p": 1},
            "children": [{"name": f"kid{i}", "queueName": child_q, "data": {"i": i}}
                         for i in range(3)],
        })  # fmt: skip
    parent = tree.job.id
    kids = [node.job.id for node in tree.children]
    with _conn(a) as conn:
        # Past the grace, the parent's node found its children on B: the parent still waits.
        until = time.monotonic() + 4 * GRACE_MS / 1000
        while time.monotonic() < until:
            assert _state(conn, parent) == "waiting-children"
            time.sleep(0.1)
        done = {_work(conn, child_q) for _ in range(3)}
        assert done == set(kids)
        poll_until(lambda: _state(conn, parent) == "waiting", 15, "the parent released")
        values = _call(conn, {"cmd": "GetChildrenValues", "id": parent})["data"]["values"]
        assert values == {k: {"from": k} for k in kids}


def _drain(conn: TcpConnection, queues: list[str], until: Callable[[], bool],
           wait_s: float) -> None:  # fmt: skip
    """Pull and ACK (result `{"from": id}`) on `queues` until `until()` or `wait_s` passed."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not until():
        for queue in queues:
            pulled = _call(conn, {"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 200})
            job = pulled.get("job")
            if job is not None:
                ack = {"cmd": "ACK", "id": job["id"], "token": pulled["token"],
                       "result": {"from": job["id"]}}  # fmt: skip
                assert _call(conn, ack)["ok"]


def test_kill_9_of_the_parents_node_mid_flow(three: Nodes) -> None:
    """The parent on C, children on A and B. Half the children complete (their notices
    applied and committed on C), then C is killed with `kill -9`; the other half complete
    while no node serves the parent (their notices wait in the outboxes). A survivor takes
    C's partitions and loads the parent with what it had counted; the waiting notices reach
    it, and the parent has every child's result, each counted once."""
    nodes, url = three
    a, c = nodes["node-a"], nodes["node-c"]
    parent_q = _queue_of(url, "node-c", "qp")
    child_q = [_queue_of(url, "node-a", "qc"), _queue_of(url, "node-b", "qc")]
    kids = [f"q{i}" for i in range(8)]
    jobs = [{"id": "qP", "queue": parent_q, "input": _node_input(children=kids, durable=True)}]
    jobs += [{"id": k, "queue": child_q[i % 2], "input": _node_input("qP", durable=True)}
             for i, k in enumerate(kids)]  # fmt: skip
    with _conn(a) as conn:
        assert _call(conn, {"cmd": "PUSHF", "jobs": jobs})["ok"]
        early = [_work(conn, queue) for queue in child_q for _ in range(2)]

        def counted() -> int:
            job = _call(conn, {"cmd": "GetJob", "id": "qP"}).get("job") or {}
            return int(job.get("childrenCompleted", 0))

        poll_until(lambda: counted() == 4, 15, "the first children counted on C")
        c.kill9_tree()
        late = [_work(conn, queue) for queue in child_q for _ in range(2)]
        assert set(early) | set(late) == set(kids)
        wait_s = 2 * LEASE_MS / 1000 + 30
        poll_until(lambda: _state(conn, "qP") == "waiting", wait_s, "the parent released")
        values = _call(conn, {"cmd": "GetChildrenValues", "id": "qP"})["data"]["values"]
        assert values == {k: {"from": k} for k in kids}
        assert counted() == 8
        poll_until(lambda: _outbox(url, kids) == 0, 10, "every notice acknowledged")


def _outbox(url: str, keys: list[str]) -> int:
    """How many of these children's notices wait in the flow outbox (not acknowledged)."""
    with psycopg.connect(url) as db:
        rows = db.execute("SELECT key FROM flow_outbox").fetchall()
    return sum(1 for (key,) in rows if str(key).split(">")[0] in keys)


def test_kill_9_of_the_childrens_node_mid_flow(three: Nodes) -> None:
    """Children on B, their parent on A. Four children complete through B while A's front end
    is frozen (SIGSTOP, well within a lease: A keeps its partitions), so their notices wait in
    B's outbox, committed; then B is killed with `kill -9` and A resumes. The survivors take
    B's partitions and load its children with those notices, and send them again; workers
    through A finish the other children (one whose ACK B had not committed runs again), and
    the parent gets every child's result, each counted once."""
    nodes, url = three
    a, b = nodes["node-a"], nodes["node-b"]
    parent_q = _queue_of(url, "node-a", "kp")
    child_q = [_queue_of(url, "node-b", "kc", k) for k in range(2)]
    kids = [f"k{i}" for i in range(8)]
    jobs = [{"id": "kP", "queue": parent_q, "input": _node_input(children=kids, durable=True)}]
    jobs += [{"id": k, "queue": child_q[i % 2], "input": _node_input("kP", durable=True)}
             for i, k in enumerate(kids)]  # fmt: skip
    with _conn(b) as conn:
        assert _call(conn, {"cmd": "PUSHF", "jobs": jobs})["ok"]
        frontend = a.child_pids()["frontend"]
        os.kill(frontend, signal.SIGSTOP)
        try:
            early = [_work(conn, queue) for queue in child_q for _ in range(2)]
            poll_until(lambda: _outbox(url, early) == 4, 5, "the notices in B's outbox")
            b.kill9_tree()
        finally:
            os.kill(frontend, signal.SIGCONT)
    with _conn(a) as conn:

        def released() -> bool:
            return _state(conn, "kP") != "waiting-children"

        _drain(conn, child_q, released, 2 * LEASE_MS / 1000 + 30)
        assert _state(conn, "kP") == "waiting", _call(conn, {"cmd": "GetJob", "id": "kP"})
        values = _call(conn, {"cmd": "GetChildrenValues", "id": "kP"})["data"]["values"]
        assert values == {k: {"from": k} for k in kids}
        assert _call(conn, {"cmd": "GetJob", "id": "kP"})["job"]["childrenCompleted"] == 8
        poll_until(lambda: _outbox(url, kids) == 0, 10, "every notice acknowledged")
