"""A node joins only once its front end listens (docs/cluster.md "Taking over"): real `shardq
start` nodes on one PostgreSQL database.

Nodes a and b serve a steady stream of reads of every partition's queues (each forwarded to
its owner when it is not the node asked) while node c starts. c takes its share from a and b
only once its TCP port accepts connections, so no read is ever forwarded to an address that
refuses the connection (`Node unavailable: ... cannot be reached`), and a client that follows
`MOVED` itself is never sent to one either. And a WaitJob parked on a job whose partition
passes to c meanwhile answers the job's completion on c.

Short leases (1500 ms). Deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from pg_server import new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection
from shardq.cluster import partition_of

NEEDS_POSTGRES = True
LEASE_MS = 1500
ROUND_S = LEASE_MS / 3000
PARTS = 12


def _node(tmp: Path, name: str, url: str, shards: int = 1) -> ShardqServer:
    settings = {"SHARDQ_STORAGE_URL": url, "SHARDQ_LEASE_MS": str(LEASE_MS),
                "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name}  # fmt: skip
    return ShardqServer(tmp / name, shards=shards, env=settings)


def _held(url: str) -> dict[str, int]:
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT owner, count(*) FROM partition_leases WHERE expires_at > now() GROUP BY owner"
        ).fetchall()
    return {str(owner): int(n) for owner, n in rows}


def _one_queue_per_partition() -> list[str]:
    names: dict[int, str] = {}
    for i in range(10_000):
        names.setdefault(partition_of(f"jq{i}", PARTS), f"jq{i}")
    return [names[p] for p in range(PARTS)]


class Reads:
    """Reads of every queue through one node, round after round, every answer counted."""

    def __init__(self, node: ShardqServer, queues: list[str], follow_moved: bool) -> None:
        self.node, self.queues, self.follow = node, queues, follow_moved
        self.answers = 0
        self.refused: list[str] = []  # answers naming a node that refused the connection
        self.errors: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with TcpConnection(*self.node.tcp_address, timeout=10) as conn:
            if self.follow:
                conn.call({"cmd": "NoForward"})
            while not self.stop.is_set():
                for queue in self.queues:
                    self._read(conn, {"cmd": "GetJobCounts", "queue": queue})

    def _read(self, conn: TcpConnection, cmd: dict[str, Any]) -> None:
        reply = conn.call(cmd, check=False)
        self.answers += 1
        error = str(reply.get("error", ""))
        if "cannot be reached" in error:
            self.refused.append(error)
        elif error.startswith("MOVED "):
            # What shardq's ClusterConnection does: connect to the node named.
            host, _, port = error.rsplit(" ", 1)[1].rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
            except ConnectionRefusedError as e:
                self.refused.append(f"{error}: {e}")
        elif error:
            self.errors.add(error.split(":")[0])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)


def _wait_job(node: ShardqServer, queue: str, job_id: str, out: dict[str, Any]) -> None:
    with TcpConnection(*node.tcp_address, timeout=40) as conn:
        reply = conn.call({"cmd": "WaitJob", "id": job_id, "timeout": 25_000}, check=False)
    reply.pop("reqId", None)
    out[queue] = reply


def _push(conn: TcpConnection, queue: str) -> str:
    deadline = time.monotonic() + 15
    while True:  # a partition of a or b may be between leases for a moment
        reply = conn.call({"cmd": "PUSH", "queue": queue, "data": {}}, check=False)
        if reply.get("ok"):
            return str(reply["id"])
        assert time.monotonic() < deadline, reply
        time.sleep(0.05)


def _complete(conn: TcpConnection, queue: str, job_id: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        got = conn.call({"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 0}, check=False)
        if got.get("ok") and got.get("job"):
            assert got["job"]["id"] == job_id, got
            ack = {"cmd": "ACK", "id": job_id, "token": got["token"], "result": queue}
            assert conn.call(ack, check=False).get("ok") is True
            return
        assert time.monotonic() < deadline, got
        time.sleep(0.05)


def test_a_node_joining_under_load_never_sends_clients_to_a_closed_port(tmp_path: Path) -> None:
    url = new_database("join")
    # c runs two shards: more to start before its front end listens.
    a, b, c = _node(tmp_path, "a", url), _node(tmp_path, "b", url), _node(tmp_path, "c", url, 2)
    queues = _one_queue_per_partition()
    readers: list[Reads] = []
    try:
        a.start()
        b.start()
        poll_until(lambda: sorted(_held(url).values()) == [PARTS // 2] * 2, 8 * ROUND_S + 5,
                   "a and b to split the partitions", detail=lambda: str(_held(url)))  # fmt: skip
        readers = [Reads(a, queues, False), Reads(b, queues, False), Reads(a, queues, True),
                   Reads(b, queues, True)]  # fmt: skip
        # A WaitJob through a on a job of every partition, parked on its owner, a or b; the
        # partitions that pass to c take their jobs away from under them.
        with TcpConnection(*a.tcp_address, timeout=10) as conn:
            jobs = {q: _push(conn, q) for q in queues}
        waits: dict[str, dict[str, Any]] = {}
        waiters = [threading.Thread(target=_wait_job, args=(a, q, jobs[q], waits), daemon=True)
                   for q in queues]  # fmt: skip
        for waiter in waiters:
            waiter.start()
        time.sleep(2 * ROUND_S)
        c.start()
        poll_until(lambda: sorted(_held(url).values()) == [PARTS // 3] * 3, 8 * ROUND_S + 10,
                   "c to take its share", detail=lambda: str(_held(url)))  # fmt: skip
        time.sleep(2 * ROUND_S)  # the forwards and MOVED answers naming c, once it holds
        with TcpConnection(*c.tcp_address, timeout=10) as conn:
            for queue in queues:
                _complete(conn, queue, jobs[queue])
        for waiter in waiters:
            waiter.join(20)
    finally:
        for reader in readers:
            reader.close()
        for node in (a, b, c):
            node.close()
    # Each WaitJob answers its job's completion, wherever the job went meanwhile.
    assert waits == {q: {"ok": True, "completed": True, "result": q} for q in queues}, waits
    refused = [r for reader in readers for r in reader.refused]
    answers = sum(reader.answers for reader in readers)
    print(f"join under load: {answers} answers, {len(refused)} naming a closed port, "
          f"other errors {sorted({e for r in readers for e in r.errors})}")  # fmt: skip
    assert answers > 100
    assert refused == [], refused[:5]
