"""Any node answers any command (docs/cluster.md "Forwarding"): two real `shardq start` nodes
on one PostgreSQL database, each its own ports and data directory.

A command sent to node A for a queue of a partition node B holds is forwarded to B and B's
reply relayed; a job named by id alone is looked up on the peers when A's shards miss it; an
ACKB naming jobs on both nodes is answered whole; bunqueue-client (from PyPI) works through the
node that does not own its queue; a connection that sent `NoForward` gets `MOVED`; and an
owner that is frozen or dead gives a clear `Node unavailable` error in bounded time.

Short leases (1500 ms) and a 1 s forward timeout keep each test to seconds. Deselected with
SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bunqueue
import psycopg
import pytest
from pg_server import lease_owners, new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compat"))

from bun_scripts import run_script
from shardq_harness import ShardqServer, free_port, listening, poll_until

from shardq.client import AsyncClusterConnection, ClusterConnection, Queue, TcpConnection
from shardq.cluster import partition_of

NEEDS_POSTGRES = True
LEASE_MS = 1500
PARTS = 16
Nodes = tuple[ShardqServer, ShardqServer, str]
FORWARD_TIMEOUT_MS = 1000  # below a lease: a frozen owner times out before it loses it


def _node(tmp: Path, name: str, url: str, shards: int) -> ShardqServer:
    settings = {"SHARDQ_STORAGE_URL": url, "SHARDQ_LEASE_MS": str(LEASE_MS),
                "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name,
                "SHARDQ_FORWARD_TIMEOUT_MS": str(FORWARD_TIMEOUT_MS)}  # fmt: skip
    return ShardqServer(tmp / name, shards=shards, env=settings, http_port=free_port())


def _cluster(node: ShardqServer) -> dict[str, Any]:
    with urllib.request.urlopen(f"{node.http_url}/cluster", timeout=10) as reply:
        return json.loads(reply.read())  # type: ignore[no-any-return]


def _queue_of(url: str, node: str, skip: int = 0) -> str:
    owners = lease_owners(url)
    names = (f"fq{i}" for i in range(100_000) if owners.get(partition_of(f"fq{i}", PARTS)) == node)
    for _ in range(skip):
        next(names)
    return next(names)


def _split(a: ShardqServer, b: ShardqServer, url: str) -> None:
    """Wait until the nodes hold half each and both front ends serve by that map: a
    `NoForward` connection to each gets `MOVED` for the other's queue."""
    half = {"node-a": PARTS // 2, "node-b": PARTS // 2}
    poll_until(
        lambda: all(
            {n["id"]: n["partitions"] for n in _cluster(x)["nodes"] if n["alive"]} == half
            for x in (a, b)
        ),
        6 * LEASE_MS / 1000,
        "the two nodes to split the partitions",
        detail=lambda: str(_cluster(a)),
    )

    seen: list[object] = []

    def moved_both_ways() -> bool:
        # A node joins once its front end listens, so the hand-over runs after it reported
        # ready: each front end must name the other node (a partition set aside answers MOVED
        # naming its own node for a moment) and serve its own queues (loaded by then).
        for here, there, mine, theirs in ((a, b, "node-a", "node-b"), (b, a, "node-b", "node-a")):
            with TcpConnection(*here.tcp_address, timeout=15) as conn:
                conn.call({"cmd": "NoForward"})
                reply = conn.call({"cmd": "Count", "queue": _queue_of(url, theirs)}, check=False)
                own = conn.call({"cmd": "Count", "queue": _queue_of(url, mine)}, check=False)
            address = "{}:{}".format(*there.tcp_address)
            seen[:] = [here.tcp_port, reply, own]
            error = str(reply.get("error", ""))
            if not (error.startswith("MOVED ") and error.endswith(f" {address}")):
                return False
            if own.get("ok") is not True:
                return False
        return True

    # After a node was frozen past its lease the partitions come back to it through a rebalance
    # (set aside, released, loaded): ten leases, not four, on a loaded CI machine. The frozen
    # node's own queues must be served again: they were not, while its shards waited for the
    # writer to confirm a batch the database had refused (fenced) and the writer had dropped.
    poll_until(
        moved_both_ways,
        10 * LEASE_MS / 1000,
        "both front ends to read the split map",
        detail=lambda: f"last seen (port, other's queue, own queue): {seen}\n{b.log_tail()}",
    )


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """Two nodes for the module (starting them is most of the time): the tests run in file
    order, the last ones freezing and then killing node B."""
    tmp = tmp_path_factory.mktemp("fwd")
    url = new_database("fwd")
    # One shard and two: a job id is looked up on the peers from either routing path.
    a, b = _node(tmp, "node-a", url, 1), _node(tmp, "node-b", url, 2)
    try:
        a.start()
        b.start()
        _split(a, b, url)
        yield a, b, url
    finally:
        for node in (a, b):
            if node.proc is not None and node.proc.poll() is None:
                _signal_tree(node, signal.SIGCONT)
            node.close()


def _signal_tree(node: ShardqServer, sig: int) -> None:
    for pid in [node.pid, *node.child_pids().values()]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _forwards(node: ShardqServer) -> int:
    with TcpConnection(*node.tcp_address, timeout=15) as conn:
        return int(conn.call({"cmd": "ClusterStatus"})["forwards"])


def test_a_push_through_the_other_node_lands_on_the_owner(
    nodes: Nodes,
) -> None:
    a, b, url = nodes
    queue = _queue_of(url, "node-b")
    before = _forwards(a)
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        pushed = conn.call({"cmd": "PUSH", "queue": queue, "data": {"n": 1}, "durable": True})
        counted = conn.call({"cmd": "Count", "queue": queue})
    assert pushed["ok"] is True
    assert counted["count"] == 1
    # B holds it (in memory and in the database, written by B's writer), A does not.
    with TcpConnection(*b.tcp_address, timeout=15) as conn:
        job = conn.call({"cmd": "GetJob", "id": pushed["id"]})["job"]
    assert (job["queue"], job["data"]) == (queue, {"n": 1})
    with psycopg.connect(url) as db:
        rows = db.execute("SELECT id FROM jobs WHERE queue = %s", (queue,)).fetchall()
    assert [str(r[0]) for r in rows] == [str(pushed["id"])]
    assert _forwards(a) == before + 2
    assert _forwards(b) == 0  # B answered both itself


def test_no_shard_opens_a_direct_port_on_a_shared_database(nodes: Nodes) -> None:
    """The partition guard lives in the front end: a shard's direct port would take a push
    for a partition another node holds, so with PostgreSQL no shard opens one (the setting
    is on by default)."""
    for node in nodes[:2]:
        assert node.find_log("direct port not opened: the store is PostgreSQL (a cluster)")
        shards = [pid for name, pid in node.child_pids().items() if name.startswith("shard")]
        assert shards and all(listening(pid) == set() for pid in shards)
        with TcpConnection(*node.tcp_address, timeout=15) as conn:
            assert "directPorts" not in conn.call({"cmd": "Hello", "protocolVersion": 3})


def test_get_job_and_ack_by_id_through_the_node_that_does_not_hold_the_job(
    nodes: Nodes,
) -> None:
    a, b, url = nodes
    queue = _queue_of(url, "node-b", skip=1)
    with TcpConnection(*b.tcp_address, timeout=15) as conn:
        pushed = conn.call({"cmd": "PUSH", "queue": queue, "data": {"k": "v"}, "durable": True})
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        # No queue named: A's shards miss it and A asks B.
        got = conn.call({"cmd": "GetJob", "id": pushed["id"]})
        pulled = conn.call({"cmd": "PULL", "queue": queue, "timeout": 0})
        acked = conn.call({"cmd": "ACK", "id": pulled["job"]["id"], "result": {"done": 1}})
        state = conn.call({"cmd": "GetState", "id": pushed["id"]})
        missing = conn.call({"cmd": "GetJob", "id": "no-such-job"}, check=False)
    assert got["job"]["data"] == {"k": "v"}
    assert pulled["job"]["id"] == pushed["id"]
    assert acked["ok"] is True
    assert state["state"] == "completed"
    assert (missing["ok"], missing["error"]) == (False, "Job not found")  # neither node has it


def test_an_ack_no_node_holds_is_refused_once_not_bounced_between_the_nodes(
    nodes: Nodes,
) -> None:
    # ACK is counted on its way back (a stand-in client in the front end): the stand-in must
    # keep the peer link's NoForward, or each node fans the other's lookup out again, and
    # the two links fill with the same ACK until they stop reading.
    a, b, url = nodes
    queue = _queue_of(url, "node-b", skip=1)
    before = _forwards(a) + _forwards(b)
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        for _ in range(3):
            reply = conn.call({"cmd": "ACK", "id": "no-such-job", "token": "t"}, check=False)
            assert reply["ok"] is False and "not found" in reply["error"].lower(), reply
        # The links still carry forwards.
        assert conn.call({"cmd": "PUSH", "queue": queue, "data": {}})["ok"] is True
    # A asked B once per ACK and forwarded the push; B asked nobody back.
    assert _forwards(a) + _forwards(b) - before == 4


def test_an_ackb_across_the_nodes_is_split_and_answered_whole(
    nodes: Nodes,
) -> None:
    a, b, url = nodes
    mine, theirs = _queue_of(url, "node-a", skip=2), _queue_of(url, "node-b", skip=2)
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        for queue in (mine, theirs):
            conn.call({"cmd": "PUSHB", "queue": queue, "durable": True,
                       "jobs": [{"data": {"i": i}} for i in range(3)]})  # fmt: skip
        ids = [
            job["id"]
            for queue in (mine, theirs)
            for job in conn.call({"cmd": "PULLB", "queue": queue, "count": 3, "timeout": 0})["jobs"]
        ]
        acked = conn.call({"cmd": "ACKB", "ids": ids})
        states = [conn.call({"cmd": "GetState", "id": i})["state"] for i in ids]
    assert len(ids) == 6
    assert acked["ok"] is True
    assert states == ["completed"] * 6
    with TcpConnection(*b.tcp_address, timeout=15) as conn:
        counts = conn.call({"cmd": "GetJobCounts", "queue": theirs})["counts"]
    assert counts["completed"] == 3 and counts["waiting"] == counts["active"] == 0


@pytest.mark.parametrize(("via", "owner"), [("a", "node-b"), ("b", "node-a")])
def test_heartbeat_batches_through_the_other_node_count_the_owners_jobs(
    nodes: Nodes, via: str, owner: str
) -> None:
    """A worker pulls through one node the jobs another holds and heartbeats them there: the
    batches reach the owner (through A, one shard: whole, then the peers for the rest; through
    B, two shards: its cache misses, split to its shards and the peers)."""
    a, b, url = nodes
    here = a if via == "a" else b
    queue = _queue_of(url, owner, skip=8)
    with TcpConnection(*here.tcp_address, timeout=15) as conn:
        conn.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": {"i": i}} for i in range(3)]})
        jobs = conn.call({"cmd": "PULLB", "queue": queue, "count": 3, "timeout": 0})["jobs"]
        ids = [job["id"] for job in jobs]
        beat = conn.call({"cmd": "JobHeartbeatB", "ids": ids})
        extended = conn.call({"cmd": "ExtendLocks", "ids": ids, "durations": [60_000] * 3})
        acked = conn.call({"cmd": "ACKB", "ids": ids})
    assert len(ids) == 3
    assert beat["data"]["count"] == 3, beat
    assert extended["count"] == 3, extended
    assert acked["ok"] is True


def test_bunqueue_client_through_the_node_that_does_not_own_its_queue(
    nodes: Nodes,
) -> None:
    a, b, url = nodes
    queue = _queue_of(url, "node-b", skip=3)
    producer = bunqueue.Queue(queue, host="127.0.0.1", port=a.tcp_port, command_timeout=30.0)
    try:
        job = producer.add("hello", {"n": 7})
        again = producer.get_job(job.id)
    finally:
        producer.close()
    assert again is not None and again.data["n"] == 7
    with TcpConnection(*b.tcp_address, timeout=15) as conn:
        assert conn.call({"cmd": "GetJob", "id": job.id})["job"]["queue"] == queue


def test_bunqueue_typescript_client_through_the_node_that_does_not_own_its_queue(
    nodes: Nodes,
) -> None:
    # bunqueue's own TypeScript Worker (on Bun) against A, on a queue B holds: every PUSH,
    # PULL, progress, FAIL and ACK of its retries goes through A's forwards.
    a, b, url = nodes
    owners = lease_owners(url)
    base = next(f"tsf{i}" for i in range(100_000)
                if owners.get(partition_of(f"tsf{i}-retries", PARTS)) == "node-b")  # fmt: skip
    before = _forwards(a)
    got = run_script("worker_retries", a.tcp_address[1], queue=base)
    assert got["done"] is True and got["errors"] == []
    assert got["attemptsSeen"] == [0, 1, 2] and got["failed"] == ["boom 1", "boom 2"]
    assert got["state"] == "completed" and got["returnvalue"]["ok"] is True
    assert _forwards(a) - before >= 6  # at least a push, three pulls, two fails and the ack
    with TcpConnection(*b.tcp_address, timeout=15) as conn:
        assert (
            conn.call({"cmd": "GetJobCounts", "queue": f"{base}-retries"})["counts"]["completed"]
            == 1
        )


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=15) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_ready_says_each_node_holds_its_share_and_prometheus_counts_forwards(
    nodes: Nodes,
) -> None:
    a, b, _url = nodes
    for node in (a, b):
        status, body = _get(f"{node.http_url}/ready")
        assert status == 200, body
        facts = json.loads(body)["cluster"]
        assert facts == {"held": PARTS // 2, "share": PARTS // 2, "liveNodes": 2}
    _status, text = _get(f"{a.http_url}/prometheus")
    metrics = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.decode().splitlines()
        if line.startswith(("shardq_partitions_owned", "shardq_forwards_total", "shardq_lease"))
    }
    assert metrics["shardq_partitions_owned"] == PARTS // 2
    assert metrics["shardq_forwards_total"] == _forwards(a) > 0  # the tests above forwarded
    assert 0 < metrics["shardq_lease_renew_seconds"] < LEASE_MS / 1000


def test_the_http_api_of_the_other_node_pushes_and_reads_the_owners_queue(nodes: Nodes) -> None:
    a, b, url = nodes
    queue = _queue_of(url, "node-b", skip=6)
    request = urllib.request.Request(
        f"{a.http_url}/queues/{queue}/jobs",
        data=json.dumps({"name": "web", "data": {"via": "http"}}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=15) as reply:
        pushed = json.loads(reply.read())
    status, body = _get(f"{a.http_url}/jobs/{pushed['id']}")
    assert status == 200, body
    assert json.loads(body)["job"]["queue"] == queue
    with TcpConnection(*b.tcp_address, timeout=15) as conn:
        assert conn.call({"cmd": "GetJob", "id": pushed["id"]})["job"]["data"]["via"] == "http"


def test_a_schedule_made_through_the_other_node_lives_with_its_queue(nodes: Nodes) -> None:
    a, b, url = nodes
    queue = _queue_of(url, "node-b", skip=7)
    cron = {"cmd": "Cron", "name": "fwd-tick", "queue": queue, "schedule": "0 * * * *"}
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        made = conn.call(cron)["cron"]
        listed = [c["name"] for c in conn.call({"cmd": "CronList"})["crons"]]
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        conn.call({"cmd": "NoForward", "node": "test"})  # answered as a peer is: A's own only
        here = [c["name"] for c in conn.call({"cmd": "CronList"})["crons"]]
    with TcpConnection(*b.tcp_address, timeout=15) as conn:
        there = conn.call({"cmd": "CronGet", "name": "fwd-tick"})["cron"]
    assert made["queue"] == there["queue"] == queue
    assert "fwd-tick" in listed  # every node's schedules
    assert "fwd-tick" not in here  # A's shards never held it: its pushes would be fenced
    # By name (no queue): A's shards miss it and A asks B.
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        got = conn.call({"cmd": "CronGet", "name": "fwd-tick"})["cron"]
        deleted = conn.call({"cmd": "CronDelete", "name": "fwd-tick"})
    with TcpConnection(*b.tcp_address, timeout=15) as conn:
        gone = conn.call({"cmd": "CronGet", "name": "fwd-tick"}, check=False)
    assert got["queue"] == queue and deleted["ok"] is True
    assert gone["ok"] is False and "not found" in gone["error"].lower(), gone


def test_a_no_forward_connection_gets_moved(
    nodes: Nodes,
) -> None:
    a, b, url = nodes
    queue = _queue_of(url, "node-b")
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        assert conn.call({"cmd": "NoForward"})["ok"] is True
        moved = conn.call({"cmd": "Count", "queue": queue}, check=False)
    part = partition_of(queue, PARTS)
    assert (moved["ok"], moved["error"]) == (False, f"MOVED {part} 127.0.0.1:{b.tcp_port}")


def test_shardq_client_follows_moved_once_then_goes_to_the_owner_directly(
    nodes: Nodes,
) -> None:
    a, b, url = nodes
    theirs, mine = _queue_of(url, "node-b", skip=5), _queue_of(url, "node-a", skip=5)
    before = _forwards(a)
    with ClusterConnection(f"tcp://127.0.0.1:{a.tcp_port}", timeout=15) as conn:
        conn.call({"cmd": "PUSH", "queue": theirs, "data": {"n": 1}})
        # A answered MOVED (the connection sent NoForward), the client pushed to B.
        assert (conn.map.partitions, conn.map.redirects, conn.map.direct) == (PARTS, 1, 1)
        assert conn.map.owners == {partition_of(theirs, PARTS): f"127.0.0.1:{b.tcp_port}"}
        conn.call({"cmd": "PUSH", "queue": theirs, "data": {"n": 2}})
        assert (conn.map.redirects, conn.map.direct) == (1, 2)  # straight to B
        conn.call({"cmd": "PUSH", "queue": mine, "data": {}})
        both = conn.call_many([{"cmd": "Count", "queue": q} for q in (theirs, mine)])
        assert (conn.map.redirects, conn.map.direct) == (1, 3)  # A's queue went to A
    assert [r["count"] for r in both] == [2, 1]
    assert _forwards(a) == before  # A forwarded none of it
    # A Queue on such a connection: its push goes to B after one MOVED; GetJob names no
    # queue, so it goes to A, which looks the id up on B (one lookup forwarded).
    seed = ClusterConnection(f"tcp://127.0.0.1:{a.tcp_port}", timeout=15)
    with Queue(theirs, connection=seed) as queue:
        job_id = queue.add("q", {"n": 9})
        job = queue.get_job(job_id)
    assert job is not None and job.data["n"] == 9
    assert (seed.map.redirects, seed.map.direct) == (1, 1)
    seed.close()
    assert _forwards(a) == before + 1
    before += 1

    async def over_zmq() -> tuple[int, int, int]:
        seed = f"zmq://127.0.0.1:{a.zmq_port}"
        async with AsyncClusterConnection(seed, timeout=15) as conn:
            await conn.call({"cmd": "PUSH", "queue": theirs, "data": {"n": 3}})
            await conn.call({"cmd": "PUSH", "queue": theirs, "data": {"n": 4}})
            count = (await conn.call({"cmd": "Count", "queue": theirs}))["count"]
            return conn.map.redirects, conn.map.direct, count

    assert asyncio.run(over_zmq()) == (1, 3, 5)  # 2 + the Queue's 1 + these 2
    assert _forwards(a) == before


def test_a_frozen_then_dead_owner_gives_a_clear_error_not_a_hang(
    nodes: Nodes,
) -> None:
    a, b, url = nodes
    queue = _queue_of(url, "node-b", skip=4)
    with TcpConnection(*a.tcp_address, timeout=30) as conn:
        conn.call({"cmd": "Count", "queue": queue})  # the link to B is open
        _signal_tree(b, signal.SIGSTOP)
        started = time.monotonic()
        frozen = conn.call({"cmd": "Count", "queue": queue}, check=False)
        waited = time.monotonic() - started
        # A job id A's shards lack may be B's: B not answering is not "not found".
        unknown = conn.call({"cmd": "GetJob", "id": "maybe-on-b"}, check=False)
        _signal_tree(b, signal.SIGCONT)
    assert frozen["ok"] is False, frozen
    assert frozen["error"].startswith("Node unavailable: node 127.0.0.1:"), frozen
    assert "did not answer within 1 s" in frozen["error"]
    assert FORWARD_TIMEOUT_MS / 1000 - 0.1 <= waited < FORWARD_TIMEOUT_MS / 1000 + 3
    assert unknown["ok"] is False and unknown["error"].startswith("Node unavailable: "), unknown
    # B wakes (it may have lost its partitions meanwhile) and the two split again; then B dies.
    _split(a, b, url)
    queue = _queue_of(url, "node-b", skip=4)
    with TcpConnection(*a.tcp_address, timeout=30) as conn:
        b.kill9_tree()
        started = time.monotonic()
        # B's lease runs at least 2/3 of a lease more: A still sends B's queue there, and
        # B's port refuses the connection.
        dead = conn.call({"cmd": "Count", "queue": queue}, check=False)
        refused = conn.call({"cmd": "Count", "queue": queue}, check=False)
        quick = time.monotonic() - started
    assert dead["ok"] is False and dead["error"].startswith("Node unavailable: node 127.0.0.1:")
    # Sent on the open link before A saw it reset, or on a new connection B's port refused;
    # on a loaded machine B's tree may take longer than the forward timeout to die.
    reasons = (" closed the link", "cannot be reached", "did not answer within 1 s")
    assert any(r in dead["error"] for r in reasons), dead
    assert refused["ok"] is False and "cannot be reached" in refused["error"], refused
    assert quick < LEASE_MS / 1000
    # Then A takes B's partitions and serves the queue itself.
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        poll_until(
            lambda: conn.call({"cmd": "Count", "queue": queue}, check=False)["ok"],
            4 * LEASE_MS / 1000 + 2,
            "node-a to serve node-b's queue",
        )
