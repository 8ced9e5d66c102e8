"""A long free list is rebuilt, not stepped through (issue 22), against the real server.

- After a drain that leaves most of the file free, the idle writer copies the live pages into
  a compact file beside the database and swaps it in: the file ends far below its peak, while
  durable pushes every 1.5 s keep being answered (a commit makes the copy under way
  useless; the next idle moment starts another).
- A writer killed with SIGKILL while it copies loses no acknowledged job: the restarted one
  removes the unfinished copy and rebuilds again. (A kill at each point of the swap itself,
  a few ms long, is tests/storage/test_vacuum_rebuild.py's.)
- No step runs on a free list longer than `vacuum_step_max_free_pages`, where one page could
  hold a commit up past `vacuum_step_ms`: when no copy can be made (too little disk), the
  writer holds, through a light load's idle gaps, rather than step one page at a time; and a
  list that long but under half the file is rebuilt, not stepped through.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from shardq_harness import ShardqServer, free_port
from test_vacuum_server import BATCH, PAD, file_bytes, push_and_drain, scrape

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
# The rebuild's pause (the swap: a close, a rename, a directory fsync and a reopen) measured
# 2-10 ms here; a durable push also waits for its own commit, which on a loaded 2-core machine
# (load averages of 10 and more while other suites run) takes tens of ms, and for the idle
# checkpoint before the swap: the bound is generous but far below the copy's time.
PUSH_BOUND_S = 1.0
ENV = {"SHARDQ_VACUUM_REBUILD_MIN_FREE_PAGES": "2048"}
# Between two pushes of the light load: longer than the 1 s of idle a pass (and a copy) waits
# for, so that one starts in each gap and no pass of steps runs in the drain's short pauses.
GAP_S = 1.5


def check_file(path: Path, queue: str, count: int) -> None:
    """The stopped server's file: whole, incremental, WAL mode, `count` jobs in `queue`."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        sql = "SELECT count(*) FROM jobs WHERE queue = ?"
        assert db.execute(sql, (queue,)).fetchone()[0] == count


def test_a_long_free_list_is_rebuilt_while_durable_pushes_are_answered(
    shardq_server: Factory,
) -> None:
    server = shardq_server(shards=1, env={**ENV, "SHARDQ_VACUUM_IDLE_MS": "1000"})
    path = server.data_path
    pushed: list[str] = []
    slowest = 0.0
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        peak = push_and_drain(conn, "big", 20_000, path)
        deadline = time.monotonic() + 60
        while (
            server.find_log("vacuum done", way="rebuild") is None
            and time.monotonic() < deadline
        ):
            sent = time.monotonic()
            reply = conn.call({"cmd": "PUSH", "queue": "light", "data": {"n": len(pushed)},
                               "durable": True})  # fmt: skip
            slowest = max(slowest, time.monotonic() - sent)
            pushed.append(reply["id"])
            time.sleep(GAP_S)
        done = server.find_log("vacuum done", way="rebuild")
        assert done is not None, server.log_tail()
        assert slowest < PUSH_BOUND_S, f"a durable push took {slowest:.3f} s"
        assert done["swap_ms"] < PUSH_BOUND_S * 1000, done
        assert done["pages"] > 5000, done  # 20,000 jobs of 1 KB: about 10,000 pages went
        after = file_bytes(path)
        assert after < peak // 5, (peak, after, done)
        assert server.find_log("vacuum started", way="rebuild") is not None
        # The server goes on with the new file: every push of the light load is there, whole.
        assert conn.call({"cmd": "Count", "queue": "light"})["count"] == len(pushed)
        for n, job_id in enumerate(pushed):
            assert conn.call({"cmd": "GetJob", "id": job_id})["job"]["data"] == {"n": n}
        more = conn.call({"cmd": "PUSH", "queue": "light", "data": {"n": -1}, "durable": True})
        assert conn.call({"cmd": "GetJob", "id": more["id"]})["job"]["data"] == {"n": -1}
    assert server.stop() == 0, server.log_tail()
    assert not Path(f"{path}.rebuild").exists()
    assert not Path(f"{path}.retired").exists()  # the old file, unlinked after the swap
    check_file(path, "light", len(pushed) + 1)


def test_a_writer_killed_while_it_copies_loses_no_acknowledged_job(
    shardq_server: Factory,
) -> None:
    # The idle time is long enough that no pause of the drain starts a copy.
    server = shardq_server(shards=1, env={**ENV, "SHARDQ_VACUUM_IDLE_MS": "1000"})
    path = server.data_path
    copy = Path(f"{path}.rebuild")
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        kept = []
        for start in range(0, 4000, BATCH):  # some 4 MB stay: the copy takes a while
            kept += conn.call({"cmd": "PUSHB", "queue": "kept", "jobs": [
                {"data": {"n": start + n, "pad": PAD}, "durable": True} for n in range(BATCH)
            ]})["ids"]  # fmt: skip
        peak = push_and_drain(conn, "big", 20_000, path)
        writer = server.child_pids()["writer"]
        deadline = time.monotonic() + 30
        while not copy.exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert copy.exists(), server.log_tail()
        os.kill(writer, signal.SIGKILL)
        server.wait_child_replaced("writer", writer, 30)
        # The new writer rebuilds again and swaps the copy in.
        done = server.wait_for_log("vacuum done", timeout=60, way="rebuild")
        assert file_bytes(path) < peak // 2, done
        assert conn.call({"cmd": "Count", "queue": "kept"})["count"] == len(kept)
        for job_id in kept[::97]:
            assert conn.call({"cmd": "GetJob", "id": job_id})["job"]["data"]["pad"] == PAD
    assert server.stop() == 0, server.log_tail()
    check_file(path, "kept", len(kept))


# Steps allowed on a free list of at most 2,048 pages: a drain of 20,000 jobs of 1 KB leaves
# about 10,000. A second of idle before a pass: none runs in the drain's short pauses.
CAPPED = {**ENV, "SHARDQ_VACUUM_STEP_MAX_FREE_PAGES": "2048", "SHARDQ_VACUUM_IDLE_MS": "1000"}


def test_no_step_runs_on_a_free_list_too_long_for_one_while_a_light_load_goes_on(
    shardq_server: Factory,
) -> None:
    # A disk margin no disk has: no copy can start. Steps of one page took over then, each
    # looking for its page along the whole list.
    env = {**CAPPED, "SHARDQ_VACUUM_REBUILD_DISK_MARGIN_MB": str(1 << 20)}
    server = shardq_server(shards=1, env=env, http_port=free_port())
    path = server.data_path
    pushed: list[str] = []
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        peak = push_and_drain(conn, "big", 20_000, path)
        held = server.wait_for_log("vacuum steps held: the free list is too long for one",
                                   timeout=30)  # fmt: skip
        assert held["why"] == "no copy" and held["free_pages"] > 2048, held
        assert held["step_max_free_pages"] == 2048, held
        # A light load whose gaps are longer than the idle time: a pass is wanted after each
        # commit, and each time the writer decides the same.
        for n in range(4):
            reply = conn.call({"cmd": "PUSH", "queue": "light", "data": {"n": n},
                               "durable": True})  # fmt: skip
            pushed.append(reply["id"])
            time.sleep(GAP_S)
        assert server.find_log("vacuum rebuild skipped: too little free disk for the copy")
        vacuum = [line for line in server.logs() if line["event"].startswith("vacuum ")]
        assert not [line for line in vacuum if line["event"] in ("vacuum started",
                    "vacuum progress", "vacuum done")], vacuum  # fmt: skip
        want = ("shardq_writer_vacuumed_pages_total", "shardq_sqlite_free_pages")
        figures = scrape(server, want)
        assert figures["shardq_writer_vacuumed_pages_total"] == 0, figures
        assert figures["shardq_sqlite_free_pages"] > 2048, figures
        assert file_bytes(path) > peak // 2  # nothing given back: the rebuild could not run
        assert conn.call({"cmd": "Count", "queue": "light"})["count"] == len(pushed)
    assert server.stop() == 0, server.log_tail()
    check_file(path, "light", len(pushed))


def test_a_free_list_too_long_for_steps_is_rebuilt_under_half_the_file(
    shardq_server: Factory,
) -> None:
    server = shardq_server(shards=1, env=CAPPED)
    path = server.data_path
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        kept = []
        for start in range(0, 20_000, BATCH):  # more stays than goes: under half is free
            kept += conn.call({"cmd": "PUSHB", "queue": "kept", "jobs": [
                {"data": {"n": start + n, "pad": PAD}, "durable": True} for n in range(BATCH)
            ]})["ids"]  # fmt: skip
        peak = push_and_drain(conn, "big", 15_000, path)
        done = server.wait_for_log("vacuum done", timeout=60)
        assert done["way"] == "rebuild", done
        started = server.find_log("vacuum started")
        assert started is not None and started["way"] == "rebuild", started
        assert 2048 < started["free_pages"] < started["pages"] // 2, started
        assert file_bytes(path) < peak * 3 // 4, done
        assert conn.call({"cmd": "Count", "queue": "kept"})["count"] == len(kept)
    assert server.stop() == 0, server.log_tail()
    check_file(path, "kept", len(kept))
