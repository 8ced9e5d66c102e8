"""A Drain of a cold backlog on PostgreSQL: the batch records its range and commits at once,
the writer deletes the rows in pieces between its other batches (`storage/_pg_drain.py`,
`writer/_drain_pieces.py`), so another queue's durable pushes are answered meanwhile; a kill -9
of the shard and the writer mid-deletion loses no job pushed after the Drain and brings back
none drained; and a node killed mid-deletion leaves its range to the node that takes the
queue's partition over, which deletes the rest.

The deletion is observed from outside, in the database: the drained queue's rows left, and
`drain_pending`, over a connection of the test's own.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from pg_server import lease_owners, new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, free_port, poll_until
from test_drain_pieces_server import (
    OTHER,
    QUEUE,
    WAIT_S,
    _cold_settled,
    _queued,
    kill_9_mid_deletion,
)

from shardq.client import TcpConnection
from shardq.cluster import partition_of

NEEDS_POSTGRES = True
BATCH = 1000
LEASE_MS = 1500
PARTS = 16


class Rows:
    """A queue's rows and the pending ranges, read from the database."""

    def __init__(self, url: str, queue: str = QUEUE) -> None:
        self.db = psycopg.connect(url, autocommit=True)
        self.queue = queue

    def left(self) -> int:
        sql = "SELECT count(*) FROM jobs WHERE queue = %s"
        return int(self.db.execute(sql, (self.queue,)).fetchone()[0])  # type: ignore[index]

    def pending(self) -> dict[str, int]:
        rows = self.db.execute("SELECT queue, seq FROM drain_pending").fetchall()
        return {str(q): int(s) for q, s in rows}


def _env(url: str, piece_rows: int, piece_ms: int = 0) -> dict[str, str]:
    return {
        "SHARDQ_STORAGE_URL": url,
        "SHARDQ_ENGINE_HEAD_JOBS": "100",
        "SHARDQ_DRAIN_CHUNK_ROWS": str(piece_rows),
        "SHARDQ_DRAIN_PIECE_MS": str(piece_ms),
    }


def _call(conn: TcpConnection, cmd: dict[str, Any]) -> dict[str, Any]:
    """`cmd`'s reply, retrying `Partition unavailable` (docs/cluster.md: "retry shortly"):
    a node among several refuses its queues so, changing nothing, while it renews a lease,
    and a lease round on a loaded machine can run late enough to meet a command."""
    deadline = time.monotonic() + WAIT_S
    while True:
        reply: dict[str, Any] = conn.call(cmd, check=False)
        error = str(reply.get("error", ""))
        if not error.startswith("Partition unavailable") or time.monotonic() > deadline:
            assert reply.get("ok") is True, reply
            return reply
        time.sleep(0.05)


def _push(conn: TcpConnection, total: int, tag: str, queue: str = QUEUE) -> list[str]:
    ids: list[str] = []
    for start in range(0, total, BATCH):
        end = min(total, start + BATCH)
        jobs = [{"data": {tag: i}, "durable": True} for i in range(start, end)]
        ids += _call(conn, {"cmd": "PUSHB", "queue": queue, "jobs": jobs})["ids"]
    return ids


def test_durable_pushes_are_answered_between_the_pieces_of_a_drain_on_postgres(
    tmp_path: Path, servers: list[ShardqServer]
) -> None:
    """The default piece sizing (`drain_piece_ms` 20): the longest wait of another queue's
    durable push during the deletion is a piece, not the deletion."""
    total = 30_000
    url = new_database("dpp")
    server = ShardqServer(tmp_path / "n", shards=1, env=_env(url, 50_000, 20))
    servers.append(server.start())
    rows = Rows(url)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        _push(conn, total, "i")
        _cold_settled(conn, total - 300)
        started = time.monotonic()
        assert _call(conn, {"cmd": "Drain", "queue": QUEUE})["count"] == total
        drain_ms = (time.monotonic() - started) * 1000
        assert _queued(conn) == 0  # gone at once, for every read
        seen: list[int] = []
        waits: list[float] = []
        for n in range(20_000):
            sent = time.monotonic()
            conn.call({"cmd": "PUSH", "queue": OTHER, "data": {"n": n}, "durable": True})
            waits.append(time.monotonic() - sent)
            seen.append(rows.left())
            if seen[-1] == 0 or time.monotonic() - started > WAIT_S:
                break
        assert _queued(conn) == 0 and conn.call({"cmd": "Count", "queue": QUEUE})["count"] == 0
    between = sorted({n for n in seen if 0 < n < total}, reverse=True)
    longest = max(waits) * 1000
    print(f"Drain answered in {drain_ms:.0f} ms; {len(seen)} durable pushes answered while"
          f" {len(between)} different counts of rows were left; the longest waited"
          f" {longest:.0f} ms (load {os.getloadavg()[0]:.1f})")  # fmt: skip
    assert seen[-1] == 0, seen[-5:]
    assert len(between) >= 3, seen[:20]
    assert longest < 5000, longest  # generous: a shared machine; a piece is about 20 ms
    assert rows.pending() == {}
    done = server.wait_for_log("drain_deleted", timeout=WAIT_S, queue=QUEUE)
    assert total - 300 <= done["rows"] < total and done["pieces"] >= 3, done
    failed = [line for line in server.logs() if line.get("level") in ("error", "critical")]
    assert not failed, failed[:3]
    assert server.stop() == 0, server.log_tail()


def test_kill_9_of_the_shard_and_the_writer_mid_deletion_on_postgres(
    tmp_path: Path, servers: list[ShardqServer]
) -> None:
    url = new_database("dpk")

    def start() -> ShardqServer:
        server = ShardqServer(tmp_path / f"n{len(servers)}", shards=1, env=_env(url, 20))
        servers.append(server)
        return server.start()

    def serving(conn: TcpConnection) -> None:
        # A new writer takes the node's partitions again, and the shard loads them.
        poll_until(lambda: _answers(conn, QUEUE), WAIT_S, f"the node to serve {QUEUE}")

    kill_9_mid_deletion(start, lambda _server: Rows(url), 20_000, 1_500, push=_push, call=_call,
                        pieces_first=True, serving=serving)  # fmt: skip


def test_get_job_of_the_rows_the_next_pieces_delete_never_sees_a_drained_job(
    tmp_path: Path, servers: list[ShardqServer]
) -> None:
    """GetJob, again and again, of the rows the writer's next pieces delete, until the range
    is gone: a piece deletes its rows and raises the range's lower bound past them in one
    commit, and a read by id that met one (the row read before it, the range after) answered
    a drained job (`storage/_drain_bounds.BY_ID`). No kill: the shard's own record of the
    Drain hides its rows only until the writer confirms it, the range alone after that."""
    total = 20_000
    url = new_database("dpf")
    server = ShardqServer(tmp_path / "n", shards=1, env=_env(url, 20))
    servers.append(server.start())
    rows = Rows(url)
    front = "SELECT id FROM jobs WHERE queue = %s ORDER BY seq LIMIT 40"  # about two pieces
    seen: list[str] = []
    asked = 0
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        _push(conn, total, "i")
        _cold_settled(conn, total - 300)
        assert _call(conn, {"cmd": "Drain", "queue": QUEUE})["count"] == total
        poll_until(lambda: QUEUE in rows.pending(), WAIT_S, "the range to be recorded")
        deadline = time.monotonic() + WAIT_S
        for _ in range(total):
            ids = [str(i) for (i,) in rows.db.execute(front, (QUEUE,)).fetchall()]
            if not ids or time.monotonic() > deadline:
                break
            for job_id in ids:
                reply: dict[str, Any] = conn.call({"cmd": "GetJob", "id": job_id}, check=False)
                asked += 1
                if reply.get("job"):
                    seen.append(job_id)
    print(f"{asked} GetJobs at the deletion front; {len(seen)} saw a drained job"
          f" (load {os.getloadavg()[0]:.1f})")  # fmt: skip
    assert not seen, seen[:5]
    assert rows.left() == 0 and asked >= 100, asked  # the reads went on until the range ended
    poll_until(lambda: not rows.pending(), WAIT_S, "the range to end")
    assert server.stop() == 0, server.log_tail()


def _held_by(url: str, node: str) -> set[int]:
    return {p for p, o in lease_owners(url).items() if o == node}


def test_a_node_killed_mid_deletion_leaves_its_range_to_the_next_owner(
    tmp_path: Path, servers: list[ShardqServer]
) -> None:
    """Two nodes on one database; a queue of node a is drained and a is killed (kill -9 of
    every process) while its writer deletes the range: b takes the partition once a's lease
    lapses, and b's writer, which never saw the Drain, deletes the rest. Meanwhile b's reads
    never show a drained job; the jobs pushed after the Drain stay."""
    total, after_count = 20_000, 500
    url = new_database("dpt")
    nodes: dict[str, ShardqServer] = {}
    for name in ("node-a", "node-b"):
        env = {**_env(url, 20), "SHARDQ_LEASE_MS": str(LEASE_MS),
               "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name}  # fmt: skip
        nodes[name] = ShardqServer(tmp_path / name, shards=1, env=env, http_port=free_port())
        servers.append(nodes[name].start())
    a, b = nodes["node-a"], nodes["node-b"]
    poll_until(lambda: len(_held_by(url, "node-a")) == len(_held_by(url, "node-b")) == PARTS // 2,
               10, "the two nodes to split the partitions")  # fmt: skip
    held = _held_by(url, "node-a")
    queue = next(q for q in (f"dt{i}" for i in range(100)) if partition_of(q, PARTS) in held)
    rows = Rows(url, queue)
    with TcpConnection(*a.tcp_address, timeout=WAIT_S) as conn:
        drained = _push(conn, total, "i", queue)
        _cold_settled(conn, total - 300)
        assert _call(conn, {"cmd": "Drain", "queue": queue})["count"] == total
        after = _push(conn, after_count, "after", queue)
        left = rows.left()
    assert queue in rows.pending() and left > after_count + 1000, left
    poll_until(lambda: rows.left() < left - 200, WAIT_S, "node-a's pieces to start")
    a.kill9_tree()
    killed = time.monotonic()
    left_at_kill = rows.left()
    poll_until(lambda: partition_of(queue, PARTS) in _held_by(url, "node-b"), 10,
               "node-b to take node-a's partitions")  # fmt: skip
    with TcpConnection(*b.tcp_address, timeout=WAIT_S) as conn:
        poll_until(lambda: _answers(conn, queue), 10, f"node-b to serve {queue}")
        _check_queue(conn, queue, drained, after)
        poll_until(lambda: not rows.pending(), WAIT_S, "node-b to delete the rest of the range")
        assert rows.left() == after_count
        _check_queue(conn, queue, drained, after)
    took = time.monotonic() - killed
    done = b.wait_for_log("drain_deleted", timeout=WAIT_S, queue=queue)
    print(
        f"node-a killed with {left_at_kill - after_count} drained rows left; node-b deleted"
        f" {done['rows']} in {done['pieces']} pieces, the range gone {took:.1f} s later"
    )
    assert left_at_kill < left and 0 < done["rows"] <= left_at_kill - after_count, done
    assert b.stop() == 0, b.log_tail()


def _answers(conn: TcpConnection, queue: str) -> bool:
    reply: dict[str, Any] = conn.call({"cmd": "GetJobCounts", "queue": queue}, check=False)
    return bool(reply.get("ok"))


def _check_queue(conn: TcpConnection, queue: str, drained: list[str], after: list[str]) -> None:
    """`_check` for another queue: every job pushed after the Drain is there, none drained."""
    c = conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"]
    assert int(c["waiting"]) + int(c["prioritized"]) + int(c["delayed"]) == len(after), c
    listed = conn.call({"cmd": "GetJobs", "queue": queue, "limit": 10_000})["jobs"]
    assert {j["id"] for j in listed} == set(after)
    for job_id in drained[:: len(drained) // 50]:
        reply: dict[str, Any] = conn.call({"cmd": "GetJob", "id": job_id}, check=False)
        assert not reply.get("job"), reply


def test_each_piece_starts_past_the_rows_the_last_one_deleted() -> None:
    """PostgreSQL keeps a deleted row's index entries until a vacuum: a piece read from the
    range's lower bound would walk every entry the earlier pieces left (quadratic in the
    range). Each piece raises the bound past its rows instead; the reads stay the same."""
    from shardq.storage import open_postgres

    with open_postgres(new_database("dpa")) as store:
        store.apply([("put", {"id": f"j{i}", "queue": "qa", "state": "waiting", "seq": i,
                              "cold": 1, "data": {}}) for i in range(1, 1001)])  # fmt: skip
        store.apply([("qdrain", "qa", 2000)])
        store.apply([("put", {"id": "late", "queue": "qa", "state": "waiting", "seq": 2001,
                              "cold": 1, "data": {}})])  # fmt: skip
        bounds = []
        for _ in range(3):
            assert store.drain_step(100) == ("qa", 100, False)
            bounds.append(store.drain_floor("qa"))
        assert bounds == [(99, 2000), (199, 2000), (299, 2000)]
        assert [r["id"] for r in store.page_waiting("qa", limit=10).records] == ["late"]
        assert store.cold_counts("qa").waiting == 1 and store.get_job("j500") is None
        while (step := store.drain_step(400)) is not None and not step[2]:
            pass
        assert store.pending_drains == {} and store.cold_counts("qa").waiting == 1
        assert [r["id"] for r in store.load_jobs()] == ["late"]
