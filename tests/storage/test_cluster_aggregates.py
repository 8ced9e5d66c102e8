"""Cluster-wide answers (docs/cluster.md, "Cluster-wide answers"): three real `shardq start`
nodes on one PostgreSQL database, jobs on queues that each node owns, and the commands that
name no queue asked of any node.

- Stats, ListQueues, the legacy Metrics, ListWorkers, DashboardOverview and DashboardQueues,
  asked of each node, answer for all three: the exact sums of what was pushed, pulled, acked
  and failed, every queue, every node's workers; `local: true` answers for one node, and the
  cluster-wide answer is the merge of the three local ones.
- The HTTP API (GET /queues, /stats, /workers, /dashboard, /dashboard/queues) and the CLI
  (`shardq queue list`, `shardq status`) through one node show every node's queues; /health
  and /prometheus stay this node's.
- A frozen node (SIGSTOP) is left out after `gather_timeout_ms` and named, and is part of the
  answer again once it runs.
- `kill -9` of one node: the survivors answer with the others and name the dead one in
  `unreachableNodes` instead of failing; once its lease lapsed and they took its queues, the
  answer is whole again.

Leases of 7.5 s: the kill test asks the survivors while the dead node still counts as alive.
So that a loaded machine's slow answers (a loaded full run took over 5 s for them) cannot
outlast the dead node's lease, the test holds its leases and heartbeat in the database while
it asks, as a node that renewed them just before dying would have, and puts back what it had
after (`_lease_held`). Deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import lease_owners, new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, free_port, poll_until

from shardq.client import TcpConnection
from shardq.cluster import partition_of

NEEDS_POSTGRES = True
LEASE_MS = 7500
ROUND_S = LEASE_MS / 3000
PARTS = 12
GATHER_TIMEOUT_MS = 1000  # a frozen node is left out after this
NAMES = ("a", "b", "c")
STATES = ("waiting", "active", "delayed", "completed", "dlq")
RETRIED = ("Partition unavailable", "Node busy")  # answers that applied nothing
Nodes = dict[str, ShardqServer]


def _node(tmp: Path, name: str, url: str, shards: int, http: bool) -> ShardqServer:
    settings = {"SHARDQ_STORAGE_URL": url, "SHARDQ_LEASE_MS": str(LEASE_MS),
                "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name,
                "SHARDQ_GATHER_TIMEOUT_MS": str(GATHER_TIMEOUT_MS)}  # fmt: skip
    return ShardqServer(
        tmp / name, shards=shards, env=settings, http_port=free_port() if http else 0
    )


def _queues_of(url: str, prefix: str, per_node: int) -> dict[str, list[str]]:
    """`per_node` queue names owned by each node."""
    owners = lease_owners(url)
    found: dict[str, list[str]] = {n: [] for n in NAMES}
    for i in range(100_000):
        name = f"{prefix}{i}"
        mine = found[owners[partition_of(name, PARTS)]]
        if len(mine) < per_node:
            mine.append(name)
        if all(len(q) == per_node for q in found.values()):
            return found
    raise AssertionError("no queue names found for every node")


def _status(node: ShardqServer) -> dict[str, int]:
    with TcpConnection(*node.tcp_address, timeout=15) as conn:
        reply = conn.call({"cmd": "ClusterStatus"})
    return {n["id"]: n["partitions"] for n in reply["nodes"] if n["alive"]}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Nodes, str]]:
    """a (one shard, HTTP), b (two shards), c (one shard), sharing the partitions; the kill
    test, last in the file, kills b."""
    tmp = tmp_path_factory.mktemp("agg")
    url = new_database("agg")
    cluster = {
        "a": _node(tmp, "a", url, 1, http=True),
        "b": _node(tmp, "b", url, 2, http=False),
        "c": _node(tmp, "c", url, 1, http=False),
    }
    try:
        for node in cluster.values():
            node.start()
        share = dict.fromkeys(NAMES, PARTS // 3)
        poll_until(lambda: all(_status(n) == share for n in cluster.values()),
                   12 * ROUND_S + 10, "the three nodes to share the partitions")  # fmt: skip
        yield cluster, url
    finally:
        for node in cluster.values():
            node.close()


def call(conn: TcpConnection, cmd: dict[str, Any], timeout: float = 20.0) -> dict[str, Any]:
    """`cmd` through `conn`, retried while a partition is being loaded (nothing applied)."""
    deadline = time.monotonic() + timeout
    while True:
        reply = conn.call(dict(cmd), check=False)
        if not str(reply.get("error", "")).startswith(RETRIED):
            assert reply.get("ok") is True, (cmd, reply)
            return reply
        assert time.monotonic() < deadline, f"{cmd['cmd']} still refused: {reply}"
        time.sleep(0.05)


def ask(node: ShardqServer, cmd: dict[str, Any]) -> dict[str, Any]:
    with TcpConnection(*node.tcp_address, timeout=15) as conn:
        return call(conn, cmd)


def _http(node: ShardqServer, path: str) -> Any:
    with urllib.request.urlopen(f"{node.http_url}{path}", timeout=15) as reply:
        return json.loads(reply.read())


def _run_cli(node: ShardqServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardq_cli.main", *args,
         "--url", f"tcp://127.0.0.1:{node.tcp_port}", "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip


def _cli(node: ShardqServer, *args: str) -> Any:
    return json.loads(_run_cli(node, *args).stdout)


def _counts(stats: dict[str, Any]) -> dict[str, int]:
    return {k: stats[k] for k in STATES}


def _summed(replies: list[dict[str, Any]]) -> dict[str, int]:
    return {k: sum(r["stats"][k] for r in replies) for k in STATES}


def _address(node: ShardqServer) -> str:
    return f"127.0.0.1:{node.tcp_port}"


def test_every_node_answers_for_the_whole_cluster(nodes: tuple[Nodes, str]) -> None:
    cluster, url = nodes
    a, b, c = (cluster[n] for n in NAMES)
    owned = _queues_of(url, "agg", 2)
    queues = [q for n in NAMES for q in owned[n]]
    before = ask(a, {"cmd": "Metrics"})["metrics"]
    # Through a: the k-th queue gets k + 1 jobs, one delayed job on b's first queue, and one
    # job of a single attempt on c's first queue, to be failed into its DLQ.
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        for k, queue in enumerate(queues):
            for i in range(k + 1):
                call(conn, {"cmd": "PUSH", "queue": queue, "data": {"i": i}, "durable": True})
        call(conn, {"cmd": "PUSH", "queue": owned["b"][0], "data": {}, "delay": 3_600_000,
                    "durable": True})  # fmt: skip
        call(conn, {"cmd": "PUSH", "queue": owned["c"][0], "data": {"dlq": 1},
                    "maxAttempts": 1, "durable": True})  # fmt: skip
    pushed = sum(range(1, len(queues) + 1)) + 2
    # Through c: one job of each node's first queue completed, one of a's second left
    # active, c's single-attempt job failed.
    with TcpConnection(*c.tcp_address, timeout=15) as conn:
        for n in NAMES:
            job = call(conn, {"cmd": "PULL", "queue": owned[n][0], "timeout": 0, "owner": "t"})
            call(conn, {"cmd": "ACK", "id": job["job"]["id"], "token": job["token"]})
        call(conn, {"cmd": "PULL", "queue": owned["a"][1], "timeout": 0, "owner": "t",
                    "lockTtl": 600_000})  # fmt: skip
        while True:  # c's first queue: complete the rest until the single-attempt job
            job = call(conn, {"cmd": "PULL", "queue": owned["c"][0], "timeout": 0,
                               "owner": "t"})  # fmt: skip
            if job["job"]["data"] == {"dlq": 1}:
                call(conn, {"cmd": "FAIL", "id": job["job"]["id"], "token": job["token"]})
                break
            call(conn, {"cmd": "ACK", "id": job["job"]["id"], "token": job["token"]})
    completed = 3 + queues.index(owned["c"][0])  # c's first queue: every earlier job acked
    want = {"waiting": pushed - 2 - completed - 1, "active": 1, "delayed": 1,
            "completed": completed, "dlq": 1}  # fmt: skip
    pulled = completed + 2

    # Workers registered on each node, their connections kept open.
    conns: dict[str, TcpConnection] = {}
    workers = {"wa": a, "wb1": b, "wb2": b, "wc": c}
    for wid, node in workers.items():
        conns[wid] = TcpConnection(*node.tcp_address, timeout=15)
        call(conns[wid], {"cmd": "RegisterWorker", "workerId": wid, "name": wid,
                          "queues": queues[:2], "concurrency": 3})  # fmt: skip
    try:
        locals_ = {n: ask(cluster[n], {"cmd": "Stats", "local": True}) for n in NAMES}
        assert _summed(list(locals_.values())) == want
        for n in NAMES:
            node = cluster[n]
            stats = ask(node, {"cmd": "Stats"})
            assert _counts(stats["stats"]) == want, n
            assert "unreachableNodes" not in stats
            assert stats["stats"]["uptime"] == pytest.approx(
                locals_[n]["stats"]["uptime"], abs=5000
            )
            listed = ask(node, {"cmd": "ListQueues"})["queues"]
            union = set()
            for m in NAMES:
                union |= set(ask(cluster[m], {"cmd": "ListQueues", "local": True})["queues"])
            assert set(queues) <= set(listed) and listed == sorted(union), n
            mine = ask(node, {"cmd": "ListQueues", "local": True})["queues"]
            assert set(owned[n]) <= set(mine) and not set(queues) - set(owned[n]) & set(mine)
            metrics = ask(node, {"cmd": "Metrics"})["metrics"]
            assert metrics["totalPushed"] - before["totalPushed"] == pushed, n
            assert metrics["totalPulled"] - before["totalPulled"] == pulled, n
            assert metrics["totalCompleted"] - before["totalCompleted"] == completed, n
            assert metrics["totalFailed"] - before["totalFailed"] == 1, n
            listed_workers = ask(node, {"cmd": "ListWorkers"})["data"]
            ids = sorted(w["id"] for w in listed_workers["workers"])
            assert ids == sorted(workers), n
            assert listed_workers["stats"]["total"] == 4
            assert listed_workers["stats"]["concurrencySlots"] == 12
            own = ask(node, {"cmd": "ListWorkers", "local": True})["data"]["workers"]
            assert sorted(w["id"] for w in own) == sorted(
                w for w, at in workers.items() if at is node
            )
        # What a cluster-wide answer costs: every node's shards, in parallel.
        with TcpConnection(*a.tcp_address, timeout=15) as conn:
            took = {}
            for scope in ({"local": True}, {}):
                started = time.perf_counter()
                for _ in range(50):
                    call(conn, {"cmd": "Stats", **scope})
                took["local" if scope else "cluster"] = (time.perf_counter() - started) / 50
        print(f"Stats: {took['local'] * 1000:.2f} ms this node, "
              f"{took['cluster'] * 1000:.2f} ms all three")  # fmt: skip
        # The queue-scoped Metrics goes to the queue's node, as the other queue commands do.
        scoped = {"cmd": "Metrics", "queue": owned["b"][0], "type": "completed"}
        queue_metrics = ask(a, scoped)
        assert queue_metrics["data"]["meta"]["count"] == 1  # b's queue: one job completed
        assert queue_metrics == ask(b, scoped)

        # The dashboard commands on the TCP port, through b and c.
        overview = ask(b, {"cmd": "DashboardOverview"})["data"]
        assert {k: overview["stats"][k] for k in STATES} == want
        assert overview["workers"]["total"] == 4
        page = ask(c, {"cmd": "DashboardQueues", "limit": 1000})["data"]
        rows = {q["name"]: q for q in page["queues"]}
        assert set(queues) <= set(rows)
        assert sum(rows[q]["waiting"] for q in queues) == want["waiting"]
        assert rows[owned["c"][0]]["dlq"] == 1 and rows[owned["a"][1]]["active"] == 1

        # The HTTP API of a shows every node's queues, workers and counts ...
        assert set(queues) <= set(_http(a, "/queues")["queues"])
        assert _counts(_http(a, "/stats")["stats"]) == want
        assert sorted(w["id"] for w in _http(a, "/workers")["data"]["workers"]) == sorted(workers)
        board = _http(a, "/dashboard")
        assert {k: board["stats"][k] for k in STATES} == want
        assert board["workers"]["total"] == 4
        http_rows = {q["name"]: q for q in _http(a, "/dashboard/queues?limit=1000")["queues"]}
        assert {q: http_rows[q]["waiting"] for q in queues} == {
            q: rows[q]["waiting"] for q in queues
        }
        # ... while /health and the Prometheus text are a's own (each node is scraped).
        health = _http(a, "/health")
        assert health["queues"]["waiting"] == locals_["a"]["stats"]["waiting"]
        with urllib.request.urlopen(f"{a.http_url}/prometheus", timeout=15) as reply:
            text = reply.read().decode()
        assert f"bunqueue_jobs_waiting {float(locals_['a']['stats']['waiting'])}" in text
        for q in owned["b"] + owned["c"]:
            assert f'queue="{q}"' not in text

        # The CLI through one node lists every node's queues.
        listed = _cli(a, "queue", "list")
        assert set(queues) <= set(listed)
        assert {q: listed[q]["counts"]["waiting"] for q in queues} == {
            q: rows[q]["waiting"] for q in queues
        }
        status = _cli(c, "status")
        assert _counts(status["stats"]) == want and status["workers"]["total"] == 4
        assert set(queues) <= set(status["queues"]) and "unreachableNodes" not in status
    finally:
        for conn in conns.values():
            conn.close()


@contextlib.contextmanager
def _lease_held(url: str, node: str) -> Iterator[list[int]]:
    """Hold `node`'s unexpired partition leases and its heartbeat in the database (an hour
    ahead: still within its lease, whatever the load) for the block, which gets the partitions
    held; then put back the times the node itself had written, so its lease lapses as it would
    have. For a node already dead: a live one would overwrite them at its next renewal."""
    ahead = "now() + interval '1 hour'"
    with psycopg.connect(url, autocommit=True) as db:
        leases = db.execute(
            "SELECT partition, expires_at FROM partition_leases"
            " WHERE owner = %s AND expires_at > now() ORDER BY partition",
            (node,),
        ).fetchall()
        beat = db.execute(
            "SELECT heartbeat_at FROM cluster_nodes WHERE id = %s", (node,)
        ).fetchone()
        assert beat is not None, f"no heartbeat row for {node}"
        parts = [int(p) for p, _ in leases]
        db.execute(
            f"UPDATE partition_leases SET expires_at = {ahead}"
            " WHERE owner = %s AND partition = ANY(%s)",
            (node, parts),
        )
        db.execute(f"UPDATE cluster_nodes SET heartbeat_at = {ahead} WHERE id = %s", (node,))
        try:
            yield parts
        finally:
            for part, expires in leases:
                db.execute(
                    "UPDATE partition_leases SET expires_at = %s"
                    " WHERE owner = %s AND partition = %s",
                    (expires, node, part),
                )
            db.execute("UPDATE cluster_nodes SET heartbeat_at = %s WHERE id = %s", (beat[0], node))


def _signal_tree(node: ShardqServer, sig: int) -> None:
    for pid in [node.pid, *node.child_pids().values()]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_a_frozen_node_is_left_out_after_the_gather_timeout(nodes: tuple[Nodes, str]) -> None:
    cluster, _ = nodes
    a, b, c = (cluster[n] for n in NAMES)
    local = {n: ask(cluster[n], {"cmd": "Stats", "local": True}) for n in NAMES}
    whole = _summed(list(local.values()))
    _signal_tree(c, signal.SIGSTOP)
    try:
        started = time.monotonic()
        stats = ask(a, {"cmd": "Stats"})
        waited = time.monotonic() - started
        print(f"a frozen node: Stats answered without it after {waited * 1000:.0f} ms")
        assert stats["unreachableNodes"] == [_address(c)], stats
        assert "did not answer within" in str(a.find_log("node left out of a cluster-wide answer",
                                                         node=_address(c)))  # fmt: skip
        assert _counts(stats["stats"]) == _summed([local["a"], local["b"]])
        assert GATHER_TIMEOUT_MS / 1000 <= waited < GATHER_TIMEOUT_MS / 1000 + 2.0
    finally:
        _signal_tree(c, signal.SIGCONT)

    def whole_again() -> bool:
        stats = ask(b, {"cmd": "Stats"})
        return "unreachableNodes" not in stats and _counts(stats["stats"]) == whole

    poll_until(whole_again, 10, "c back in the answers")
    ask(a, {"cmd": "Stats"})  # a's first answer with c in it again
    assert a.wait_for_log("node answers cluster-wide commands again", node=_address(c))


def _ask_within_the_lease(
    cluster: Nodes, queues: dict[str, list[Any]], local: dict[str, dict[str, Any]]
) -> None:
    """b is dead but within its lease, so still counts as alive: every survivor asks it and
    answers without it, naming it, by every route (TCP, HTTP, the CLI)."""
    a, b, c = (cluster[n] for n in NAMES)
    for node in (a, c):
        stats = ask(node, {"cmd": "Stats"})
        assert stats["unreachableNodes"] == [_address(b)], stats
        assert _counts(stats["stats"]) == _summed([local["a"], local["c"]])
        listed = ask(node, {"cmd": "ListQueues"})
        assert listed["queues"] == sorted({*queues["a"], *queues["c"]})
        assert listed["unreachableNodes"] == [_address(b)]
        workers = ask(node, {"cmd": "ListWorkers"})
        assert "survivor" in [w["id"] for w in workers["data"]["workers"]]
        assert "dies-with-b" not in [w["id"] for w in workers["data"]["workers"]]
        assert workers["unreachableNodes"] == [_address(b)]
        assert ask(node, {"cmd": "Metrics"})["unreachableNodes"] == [_address(b)]
    overview = ask(c, {"cmd": "DashboardOverview"})["data"]
    assert overview["unreachableNodes"] == [_address(b)]
    assert {k: overview["stats"][k] for k in STATES} == _summed([local["a"], local["c"]])
    assert _http(a, "/queues")["unreachableNodes"] == [_address(b)]
    assert _http(a, "/dashboard/queues")["unreachableNodes"] == [_address(b)]
    assert _cli(a, "status")["unreachableNodes"] == [_address(b)]
    listing = _run_cli(c, "queue", "list")
    assert sorted(json.loads(listing.stdout)) == sorted({*queues["a"], *queues["c"]})
    assert f"NOT ANSWERING: {_address(b)}" in listing.stderr


def test_the_survivors_answer_without_a_killed_node(nodes: tuple[Nodes, str]) -> None:
    cluster, url = nodes
    a, b, c = (cluster[n] for n in NAMES)
    owned = _queues_of(url, "kill", 1)
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        for n in NAMES:
            for _ in range(3):
                call(conn, {"cmd": "PUSH", "queue": owned[n][0], "data": {}, "durable": True})
    worker = TcpConnection(*c.tcp_address, timeout=15)
    dead_worker = TcpConnection(*b.tcp_address, timeout=15)
    try:
        call(worker, {"cmd": "RegisterWorker", "workerId": "survivor", "queues": []})
        call(dead_worker, {"cmd": "RegisterWorker", "workerId": "dies-with-b", "queues": []})
        local = {n: ask(cluster[n], {"cmd": "Stats", "local": True}) for n in NAMES}
        queues = {n: ask(cluster[n], {"cmd": "ListQueues", "local": True})["queues"]
                  for n in NAMES}  # fmt: skip
        whole = _summed(list(local.values()))

        b.kill9_tree()
        killed = time.monotonic()
        with _lease_held(url, "b") as held:
            assert len(held) == PARTS // 3, f"b's lease lapsed before it could be held: {held}"
            _ask_within_the_lease(cluster, queues, local)
            asked = time.monotonic() - killed
            print(f"kill -9 of b: the survivors' answers named it within {asked * 1000:.0f} ms")
            # b counted as alive for every answer: no survivor took a partition of b's.
            owners = lease_owners(url)
            assert [p for p in held if owners.get(p) != "b"] == [], owners
        assert a.find_log("node left out of a cluster-wide answer", node=_address(b))

        # Once b's lease lapsed (and each survivor's map says so) the survivors hold its
        # queues: the answer is whole again.
        every = sorted({q for n in NAMES for q in queues[n]})

        def whole_again() -> bool:
            for node in (a, c):
                stats, listed = ask(node, {"cmd": "Stats"}), ask(node, {"cmd": "ListQueues"})
                if "unreachableNodes" in stats or _counts(stats["stats"]) != whole:
                    return False
                if "unreachableNodes" in listed or listed["queues"] != every:
                    return False
            return True

        poll_until(whole_again, LEASE_MS / 1000 + 3 * ROUND_S + 10, "b's jobs on the survivors",
                   detail=lambda: str([ask(n, {"cmd": "Stats"}) for n in (a, c)]))  # fmt: skip
        back = time.monotonic() - killed
        print(f"kill -9 of b: whole answers again after {back * 1000:.0f} ms")
    finally:
        worker.close()
        dead_worker.close()
