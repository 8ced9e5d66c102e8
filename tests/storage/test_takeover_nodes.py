"""Partitions that change hands between two real `shardq start` nodes on one PostgreSQL
database, with their jobs (docs/cluster.md, "Taking over"): a node joining takes half the
partitions and loads their queues while the other drops them; a node stopped with SIGTERM
hands its partitions over at once and the survivor loads them; a node killed with `kill -9`
mid-load leaves them to the survivor within a lease, and a worker's lease on the dead node is
refused there. Every test drains with a ledger: nothing acknowledged lost, nothing ACKed
delivered again.

Short leases (1500 ms) keep each test to seconds. Deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pg_server import lease_owners, new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, free_port, poll_until

from shardq.client import ClientError, TcpConnection
from shardq.cluster import partition_of

NEEDS_POSTGRES = True
LEASE_MS = 1500
ROUND_S = LEASE_MS / 3000  # one renewal round
# What a busy 2-core machine (load 24: CI's `-n 2` beside other runs) adds to a hand-over's
# two steps. The survivor's lease thread wakes on the NOTIFY (or at its next round) and runs
# a round: a thread's wake-up there is some hundreds of ms late. Bounded so that the take
# still tells a release from a lapse: a lapsed lease is taken at least LEASE_MS - ROUND_S
# after the release would have been (the last renewal is at most a round before it).
WAKE_S = 0.4
assert ROUND_S + WAKE_S < LEASE_MS / 1000 - ROUND_S
# Then its shards load the partitions' queues: Python work proportional to the jobs, about
# 100 ms idle, ten times that and more at load 24. Not what the hand-over promises (docs/
# cluster.md: "within milliseconds of the release plus the load"), so only bounded loosely.
LOAD_S = 10.0
PARTS = 16
QUEUES = [f"tq{i}" for i in range(24)]
JOBS = 10  # per queue


def _node(tmp: Path, name: str, url: str) -> ShardqServer:
    settings = {"SHARDQ_STORAGE_URL": url, "SHARDQ_LEASE_MS": str(LEASE_MS),
                "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name}  # fmt: skip
    return ShardqServer(tmp / name, shards=2, env=settings, http_port=free_port())


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[dict[str, ShardqServer], str]]:
    """Two nodes, not started, on a database of their own; both killed at the end."""
    url = new_database("to")
    nodes = {name: _node(tmp_path, name, url) for name in ("node-a", "node-b")}
    try:
        yield nodes, url
    finally:
        for node in nodes.values():
            node.close()


def _held_by(url: str, node: str) -> set[int]:
    return {p for p, o in lease_owners(url).items() if o == node}


# Answers that pass: a partition being loaded, or forwarded to an owner that just died.
_RETRIED = ("Partition unavailable", "Node unavailable")


class Clients:
    """One connection per node, and commands sent to a queue's owner by following `MOVED`
    (and retrying `Partition unavailable` while a partition is being loaded, and `Node
    unavailable` while the node a command was forwarded to has died and its lease holds). A
    command by job id names no queue: it goes where the last command went (`last`), as a
    worker ACKs on the node it pulled from."""

    def __init__(self, nodes: Iterable[ShardqServer]) -> None:
        # Connected on first use: a node may not be up yet when its client is made.
        self.nodes = {f"127.0.0.1:{n.tcp_port}": n for n in nodes}
        self.conns: dict[str, TcpConnection] = {}
        self.last = next(iter(self.nodes))

    def _conn(self, address: str) -> TcpConnection:
        if address not in self.conns:
            self.conns[address] = TcpConnection(*self.nodes[address].tcp_address, timeout=15)
        return self.conns[address]

    def call(self, cmd: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        address, deadline = self.last, time.monotonic() + timeout
        while True:
            self.last = address
            try:
                conn = self._conn(address)
            except ClientError as e:
                # A joining node takes its leases before its front end listens: the node that
                # released them already answers MOVED to it. (Only connecting is retried: a
                # command sent and lost is not sent again.)
                reply = {"ok": False, "error": f"Partition unavailable: {e}"}
            else:
                reply = conn.call(cmd, check=False)
            error = str(reply.get("error", ""))
            if error.startswith("MOVED ") and error.split()[2] in self.nodes:
                address = error.split()[2]
            elif error.startswith("MOVED "):
                pass  # to a node gone (killed): its lease has not lapsed yet
            elif not error.startswith(_RETRIED):
                return reply
            if time.monotonic() >= deadline:
                raise AssertionError(f"{cmd} still refused after {timeout} s: {error}")
            time.sleep(0.02)

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


def _push_all(conn: TcpConnection, queues: Iterable[str]) -> dict[str, str]:
    pushed: dict[str, str] = {}
    for queue in queues:
        for k in range(JOBS):
            reply = conn.call({"cmd": "PUSH", "queue": queue, "data": {"k": k}, "durable": True})
            pushed[reply["id"]] = queue
    return pushed


def _drain(clients: Clients, queues: Iterable[str]) -> list[str]:
    """Pull and ACK every job of `queues` through their owners; return the ids, in order."""
    delivered: list[str] = []
    for queue in queues:
        while True:
            got = clients.call({"cmd": "PULL", "queue": queue, "owner": "drain"})
            job = got.get("job")
            if job is None:
                break
            ack = clients.call({"cmd": "ACK", "id": job["id"], "token": got["token"]})
            assert ack["ok"] is True, ack
            delivered.append(job["id"])
    return delivered


def _log_line(node: ShardqServer, event: str, *, last: bool = False) -> dict[str, Any]:
    lines = [line for line in node.logs(this_run=False) if line.get("event") == event]
    assert lines, f"no {event!r} in {node.data_dir}"
    return lines[-1 if last else 0]


def _time_of(line: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()


def _log_time(node: ShardqServer, event: str, *, last: bool = False) -> float:
    return _time_of(_log_line(node, event, last=last))


def _queue_in(parts: set[int]) -> list[str]:
    return [q for q in QUEUES if partition_of(q, PARTS) in parts]


def test_a_joining_node_loads_its_share_and_sigterm_hands_the_rest_over(
    cluster: tuple[dict[str, ShardqServer], str],
) -> None:
    nodes, url = cluster
    a, b = nodes["node-a"], nodes["node-b"]
    a.start()
    poll_until(lambda: len(_held_by(url, "node-a")) == PARTS, 3 * ROUND_S, "node-a to hold all")
    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        pushed = _push_all(conn, QUEUES)
    # A rebalance: b joins, a sets half aside for a round, drops it, releases it, b loads it.
    b.start()
    half = PARTS // 2
    poll_until(
        lambda: len(_held_by(url, "node-a")) == len(_held_by(url, "node-b")) == half,
        6 * ROUND_S + 2,
        "the two nodes to split the partitions",
        detail=lambda: str(lease_owners(url)),
    )
    assert a.wait_for_log("partitions dropped")["partitions"] >= 1
    # Released only once both shards said they dropped them (their last batches committed).
    released = _log_time(a, "partitions released for a rebalance")
    dropped = [line for line in a.logs() if line.get("event") == "partitions dropped"]
    assert len(dropped) == 2 and released >= max(_log_time(a, "partitions dropped", last=True),
                                                  _log_time(a, "partitions dropped"))  # fmt: skip
    assert a.find_log("releasing partitions the shards did not confirm dropped") is None
    b_parts = _held_by(url, "node-b")
    assert _queue_in(b_parts), "the queues must fall in both nodes' partitions"
    clients = Clients([a, b])
    try:
        # Every queue answers, at its owner, with every job pushed before the rebalance.
        for queue in QUEUES:
            counts = clients.call({"cmd": "GetJobCounts", "queue": queue})["counts"]
            assert counts["waiting"] == JOBS, (queue, counts)
        # b's shards loaded them at their start (b's first rounds may have gained them
        # already) or when told; either way, only the queues of b's partitions.
        loads = ("shard recovered", "partitions loaded")
        loaded = sum(line["jobs"] for line in b.logs() if line.get("event") in loads)
        assert loaded == JOBS * len(_queue_in(b_parts))
        # Some jobs done before the hand-over, each at its owner.
        acked: set[str] = set()
        for queue in QUEUES[:6]:
            got = clients.call({"cmd": "PULL", "queue": queue, "owner": "w"})
            ack = clients.call({"cmd": "ACK", "id": got["job"]["id"], "token": got["token"]})
            assert ack["ok"] is True, ack
            acked.add(got["job"]["id"])
        a_parts = _held_by(url, "node-a")
        assert a.stop() == 0  # SIGTERM: flush, release, exit
        stopped = time.monotonic()
        poll_until(
            lambda: len(_held_by(url, "node-b")) == PARTS, 2 * ROUND_S + 1, "node-b to take all"
        )
        clients.close()
        clients = Clients([b])
        for queue in _queue_in(a_parts):
            clients.call({"cmd": "GetJobCounts", "queue": queue}, timeout=LOAD_S)
        served = time.monotonic() - stopped
        # The hand-over, by the two nodes' own clocks (one machine): a's release, the start
        # of b's round that took the partitions (its `ms` is the round's length), the end of
        # b's load of them. The take is the hand-over's promise; the load is work.
        released = _log_time(a, "partitions released")
        acquired = _log_line(b, "partitions acquired", last=True)
        took = _time_of(acquired) - acquired["ms"] / 1000 - released
        gap = _log_time(b, "partitions loaded", last=True) - released
        print(f"hand-over: b's round took a's partitions {took * 1000:.0f} ms after a released "
              f"them, loaded them {gap * 1000:.0f} ms after; served {served * 1000:.0f} ms "
              f"after a exited; load {os.getloadavg()[0]:.1f}")  # fmt: skip
        assert acquired["count"] == len(a_parts), acquired
        # A round of b's own that began just before the release may take them: then `took`
        # is below 0.
        assert took < ROUND_S + WAKE_S, took
        assert 0 <= gap < ROUND_S + WAKE_S + LOAD_S, gap
        delivered = _drain(clients, QUEUES)
    finally:
        clients.close()
    assert len(delivered) == len(set(delivered))
    assert set(delivered) == set(pushed) - acked
    assert not set(delivered) & acked


def test_kill_9_mid_load_leaves_the_partitions_to_the_survivor_and_fences_its_workers(
    cluster: tuple[dict[str, ShardqServer], str],
) -> None:
    nodes, url = cluster
    a, b = nodes["node-a"], nodes["node-b"]
    a.start()
    b.start()
    half = PARTS // 2
    poll_until(
        lambda: len(_held_by(url, "node-a")) == len(_held_by(url, "node-b")) == half,
        6 * ROUND_S + 2,
        "the two nodes to split the partitions",
    )
    a_parts = _held_by(url, "node-a")
    a_queues = _queue_in(a_parts)
    assert a_queues
    acked: set[str] = set()
    stop = threading.Event()

    def push_to_a() -> None:
        # Durable pushes into a's queues until a dies: only the answered ones are owed.
        with TcpConnection(*a.tcp_address, timeout=5) as conn:
            i = 0
            while not stop.is_set():
                cmd = {"cmd": "PUSH", "queue": a_queues[i % len(a_queues)], "data": {"i": i},
                       "durable": True}  # fmt: skip
                try:
                    reply = conn.call(cmd, check=False)
                except (OSError, ClientError):
                    return
                if reply.get("ok"):
                    acked.add(reply["id"])
                i += 1

    with TcpConnection(*a.tcp_address, timeout=15) as conn:
        conn.call({"cmd": "PUSH", "queue": a_queues[0], "data": {}, "durable": True})
        held = conn.call({"cmd": "PULL", "queue": a_queues[0], "owner": "old-worker"})
    pusher = threading.Thread(target=push_to_a, daemon=True)
    pusher.start()
    try:
        poll_until(lambda: len(acked) >= 50, 20, "pushes to node-a")
        a.kill9_tree()
        killed = time.monotonic()
    finally:
        stop.set()
        pusher.join(10)
    clients = Clients([b])
    try:
        # A lease for a's to lapse, a round for b to take them, and the load.
        bound = LEASE_MS / 1000 + ROUND_S + 1.5
        for queue in a_queues:
            clients.call({"cmd": "GetJobCounts", "queue": queue}, timeout=bound)
        served = time.monotonic() - killed
        print(f"kill -9: node-b served node-a's partitions {served * 1000:.0f} ms after")
        assert served < bound
        # The worker that pulled from a before the kill: its lease is not b's.
        late = clients.call({"cmd": "ACK", "id": held["job"]["id"], "token": held["token"]})
        assert late["ok"] is False, late
        delivered = _drain(clients, a_queues)
    finally:
        clients.close()
    assert len(delivered) == len(set(delivered))
    assert acked <= set(delivered), len(acked - set(delivered))
    assert held["job"]["id"] in delivered  # back to waiting, delivered again: never ACKed


def test_a_rebalance_under_durable_pushes_loses_nothing(
    cluster: tuple[dict[str, ShardqServer], str],
) -> None:
    nodes, url = cluster
    a, b = nodes["node-a"], nodes["node-b"]
    a.start()
    poll_until(lambda: len(_held_by(url, "node-a")) == PARTS, 3 * ROUND_S, "node-a to hold all")
    acked: set[str] = set()
    stop = threading.Event()
    failures: list[str] = []

    def push() -> None:
        # Durable pushes to every queue, each to its owner, while b joins: a partition being
        # set aside, released or loaded answers MOVED or unavailable, and is retried.
        clients = Clients([a, b])
        try:
            i = 0
            while not stop.is_set():
                queue = QUEUES[i % len(QUEUES)]
                reply = clients.call({"cmd": "PUSH", "queue": queue, "data": {"i": i},
                                      "durable": True})  # fmt: skip
                if reply.get("ok"):
                    acked.add(reply["id"])
                else:
                    failures.append(str(reply))
                i += 1
        finally:
            clients.close()

    pusher = threading.Thread(target=push, daemon=True)
    pusher.start()
    try:
        poll_until(lambda: len(acked) >= 30, 20, "pushes before the join")
        b.start()
        half = PARTS // 2
        poll_until(
            lambda: len(_held_by(url, "node-a")) == len(_held_by(url, "node-b")) == half,
            6 * ROUND_S + 2,
            "the two nodes to split the partitions",
        )
        count = len(acked)
        poll_until(lambda: len(acked) >= count + 30, 20, "pushes after the split")
    finally:
        stop.set()
        pusher.join(20)
    assert a.find_log("partitions dropped") is not None
    clients = Clients([a, b])
    try:
        delivered = _drain(clients, QUEUES)
    finally:
        clients.close()
    assert len(delivered) == len(set(delivered))
    assert acked <= set(delivered), (len(acked - set(delivered)), failures[:5])
