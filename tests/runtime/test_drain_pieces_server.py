"""A Drain of a cold backlog in a running server: its reply and every later commit come at
once, the writer deletes the rows afterwards in pieces between its other batches
(`storage/_drain_pending.py`, `writer/_drain_pieces.py`), and a kill -9 of the shard and of
the writer in the middle loses no job pushed after the Drain and brings back none drained.

The deletion is observed from outside, in the database file: the drained queue's rows left,
and `drain_pending`, read over a read-only connection of the test's own.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from shardq_harness import ShardqServer, free_port, poll_until
from test_vacuum_server import scrape
from test_wide_cold_server import Factory

from shardq.client import TcpConnection

QUEUE = "dp-q"
OTHER = "dp-other"
BATCH = 1000
WAIT_S = 60.0


def _env(piece_rows: int) -> dict[str, str]:
    return {
        "SHARDQ_ENGINE_HEAD_JOBS": "100",
        "SHARDQ_DRAIN_CHUNK_ROWS": str(piece_rows),
        "SHARDQ_DRAIN_PIECE_MS": "0",  # every piece exactly `piece_rows` rows
    }


def _push(conn: TcpConnection, total: int, tag: str) -> list[str]:
    ids: list[str] = []
    for start in range(0, total, BATCH):
        jobs = [
            {"data": {tag: i}, "durable": True} for i in range(start, min(total, start + BATCH))
        ]
        reply = conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})
        ids += reply["ids"]
    return ids


class Rows:
    """The drained queue's rows and the pending ranges, read from the file."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)

    def left(self) -> int:
        sql = "SELECT count(*) FROM jobs WHERE queue = ?"
        return int(self.db.execute(sql, (QUEUE,)).fetchone()[0])

    def pending(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT queue, seq FROM drain_pending").fetchall())


def _cold_settled(conn: TcpConnection, at_least: int) -> None:
    def cold() -> bool:
        return int(conn.call({"cmd": "Stats"})["stats"]["coldJobs"]) >= at_least

    poll_until(cold, WAIT_S, f"{at_least} cold jobs")


def _queued(conn: TcpConnection) -> int:
    c = conn.call({"cmd": "GetJobCounts", "queue": QUEUE})["counts"]
    return int(c["waiting"]) + int(c["prioritized"]) + int(c["delayed"])


def test_durable_pushes_are_answered_between_the_pieces_of_a_drain(
    shardq_server: Factory, tmp_path: Path
) -> None:
    total = 30_000
    server = shardq_server(
        shards=1, data_dir=tmp_path / "pieces", env=_env(100), http_port=free_port()
    )
    rows = Rows(server.data_path)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        _push(conn, total, "i")
        _cold_settled(conn, total - 300)
        started = time.monotonic()
        assert conn.call({"cmd": "Drain", "queue": QUEUE})["count"] == total
        drain_ms = (time.monotonic() - started) * 1000
        assert _queued(conn) == 0  # gone at once, for every read
        # Durable pushes of another queue, each answered after its commit, while the rows go.
        seen: list[int] = []
        for n in range(20_000):
            conn.call({"cmd": "PUSH", "queue": OTHER, "data": {"n": n}, "durable": True})
            seen.append(rows.left())
            if seen[-1] == 0 or time.monotonic() - started > WAIT_S:
                break
        assert _queued(conn) == 0 and conn.call({"cmd": "Count", "queue": QUEUE})["count"] == 0
    between = sorted({n for n in seen if 0 < n < total}, reverse=True)
    print(f"Drain answered in {drain_ms:.0f} ms; {len(seen)} durable pushes answered while"
          f" {len(between)} different counts of rows were left: {between[:8]} ...")  # fmt: skip
    assert seen[-1] == 0, seen[-5:]
    # Answered while the deletion went on, and the pieces went on between the answers.
    assert len(between) >= 3, seen[:20]
    assert rows.pending() == {}
    done = server.wait_for_log("drain_deleted", timeout=WAIT_S, queue=QUEUE)
    # The head's jobs (about 100) went with the Drain's batch, one `del` each.
    assert total - 300 <= done["rows"] < total and done["pieces"] >= done["rows"] // 100, done
    # The rows deleted and the ranges left reach /prometheus (the writer's status file).
    want = {
        "shardq_writer_drained_rows_total": done["rows"],
        "shardq_writer_drain_pending_queues": 0,
    }
    poll_until(lambda: scrape(server, want) == want, 10, f"{want} in /prometheus")
    failed = [line for line in server.logs() if line.get("level") in ("error", "critical")]
    assert not failed, failed[:3]
    assert server.stop() == 0, server.log_tail()


def test_kill_9_of_the_shard_and_the_writer_mid_deletion_loses_and_resurrects_nothing(
    shardq_server: Factory, tmp_path: Path
) -> None:
    def start() -> ShardqServer:
        return shardq_server(shards=1, data_dir=tmp_path / "kill", env=_env(20))

    kill_9_mid_deletion(start, lambda server: Rows(server.data_path), 40_000, 1_500)


class RowsLike(Protocol):
    def left(self) -> int: ...

    def pending(self) -> dict[str, int]: ...


Call = Callable[[TcpConnection, dict[str, Any]], dict[str, Any]]


def kill_9_mid_deletion(
    start: Callable[[], ShardqServer],
    rows_of: Callable[[ShardqServer], RowsLike],
    total: int,
    after_count: int,
    *,
    push: Callable[[TcpConnection, int, str], list[str]] = _push,
    call: Call = lambda conn, cmd: conn.call(cmd),
    pieces_first: bool = False,
    serving: Callable[[TcpConnection], None] = lambda conn: None,
) -> None:
    """`total` cold jobs pushed and drained, `after_count` pushed after the Drain, then a
    kill -9 of the shard and the writer while the rows go (`pieces_first`: once the pieces
    have started): after the restart and after a stop and start, every job pushed after the
    Drain is there and none drained is, and the range's deletion resumed and ended.
    `serving` waits until a restarted node serves the queue (PostgreSQL: its partitions)."""
    server = start()
    rows = rows_of(server)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        drained = push(conn, total, "i")
        _cold_settled(conn, total - 300)
        assert call(conn, {"cmd": "Drain", "queue": QUEUE})["count"] == total
        after = push(conn, after_count, "after")  # seqs above the range, most of them cold
        pending = rows.pending()
        left = rows.left()
    assert QUEUE in pending and left > after_count, (pending, left)
    if pieces_first:
        poll_until(lambda: rows.left() < left - 200, WAIT_S, "the pieces to start")
        left = rows.left()
    pids = server.child_pids()
    os.kill(pids["shard-0"], signal.SIGKILL)
    os.kill(pids["writer"], signal.SIGKILL)
    server.wait_child_replaced("writer", pids["writer"], WAIT_S)
    server.wait_child_replaced("shard-0", pids["shard-0"], WAIT_S)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        print(f"killed with {left - after_count} drained rows left; after the restart"
              f" {rows.left() - after_count}")  # fmt: skip
        serving(conn)
        _check(conn, drained, after)
        poll_until(lambda: not rows.pending(), WAIT_S, "the deletion to resume and end")
        assert rows.left() == after_count
        _check(conn, drained, after)
    assert server.stop() == 0, server.log_tail()
    server = start()
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        serving(conn)
        _check(conn, drained, after)
    assert server.stop() == 0, server.log_tail()


def _check(conn: TcpConnection, drained: list[str], after: list[str]) -> None:
    """Every job pushed after the Drain is there, none drained is."""
    assert _queued(conn) == len(after)
    listed = conn.call({"cmd": "GetJobs", "queue": QUEUE, "limit": 10_000})["jobs"]
    assert {j["id"] for j in listed} == set(after)
    for job_id in drained[:: len(drained) // 50]:
        reply: dict[str, Any] = conn.call({"cmd": "GetJob", "id": job_id}, check=False)
        assert not reply.get("job"), reply
    for job_id in after[:: len(after) // 20]:
        assert conn.call({"cmd": "GetJob", "id": job_id})["job"]["id"] == job_id
