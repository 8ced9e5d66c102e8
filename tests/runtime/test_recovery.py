"""Recovery and retention against the real server (issue 10, section 6).

- Completed jobs past `max_completed` leave the disk, not only memory: under a bounded
  push/pull/ack load the row count stays at the cap and the files stop growing.
- A starting shard reads its queues' live jobs and the retained completed window only, and
  deletes completed rows an older version left on disk.
- A shard that takes longer to recover than `ready_timeout_ms` is not killed while it reports
  progress.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection
from shardq.core import Engine
from shardq.runtime.shard._progress import LOG_PROGRESS_EVERY_S
from shardq.storage import Store

Factory = Callable[..., ShardqServer]
CAP = 200  # max_completed of the servers below: small, so a short load passes it many times
# The ready bound of the slow-recovery tests: above what starting a child takes on a loaded
# 2-core machine (imports, opening the database), below what loading BACKLOG jobs takes.
READY_TIMEOUT_MS = 3000
BACKLOG = 200_000


def rows_by_state(path: Path) -> dict[str, int]:
    # A plain read-only connection: what is on disk, whatever the server holds in memory.
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return dict(conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())


def file_bytes(path: Path) -> tuple[int, int]:
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size, wal.stat().st_size if wal.exists() else 0


def push_pull_ack(conn: TcpConnection, queue: str, jobs: int, batch: int = 100) -> None:
    for start in range(0, jobs, batch):
        entries = [{"data": {"i": start + i, "pad": "x" * 200}} for i in range(batch)]
        conn.call({"cmd": "PUSHB", "queue": queue, "jobs": entries})
        reply = conn.call({"cmd": "PULLB", "queue": queue, "count": batch})
        ids = [job["id"] for job in reply["jobs"]]
        assert len(ids) == batch
        conn.call({"cmd": "ACKB", "ids": ids})


def wait_for_rows(path: Path, expected: dict[str, int], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while (found := rows_by_state(path)) != expected:
        assert time.monotonic() < deadline, f"rows on disk {found}, expected {expected}"
        time.sleep(0.05)


def test_completed_rows_stay_at_the_cap_and_the_files_plateau(shardq_server: Factory) -> None:
    env = {"SHARDQ_ENGINE_MAX_COMPLETED": str(CAP)}
    server = shardq_server(shards=1, env=env)
    sizes: list[tuple[int, int]] = []
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        for _round in range(8):  # 8 rounds of 2,000 jobs: 80 times the cap in total
            push_pull_ack(conn, "keep", 2000)
            # Every flush is committed within the flush interval; then only the cap is left.
            wait_for_rows(server.data_path, {"completed": CAP})
            sizes.append(file_bytes(server.data_path))
        # Obliterate empties the disk too, and a Clean of what was retained as well.
        push_pull_ack(conn, "gone", 100)
        conn.call({"cmd": "Obliterate", "queue": "gone"})
        cleaned = conn.call({"cmd": "Clean", "queue": "keep", "grace": 0, "state": "completed"})
        assert cleaned["count"] == CAP - 100  # "gone" held 100 of the shard's CAP completed
        wait_for_rows(server.data_path, {})
    db_sizes, wal_sizes = [s[0] for s in sizes], [s[1] for s in sizes]
    # The rows freed by deletes are reused: after the first rounds the file grows no more.
    assert max(db_sizes[3:]) <= db_sizes[2] * 1.1 + 65536, db_sizes
    # Checkpoints keep the WAL at about SQLite's autocheckpoint size (1000 pages of 4 KiB).
    assert max(wal_sizes) < 16 * 1024 * 1024, wal_sizes
    assert server.stop() == 0


def _write_legacy_database(path: Path, completed: int, waiting: int) -> None:
    """A database as an older shardq left it: every completed job still on disk."""
    engine = Engine(seed=7)
    now = 1_700_000_000_000
    pushed = [{"data": i} for i in range(completed)]
    muts = engine.apply({"cmd": "PUSHB", "queue": "old", "jobs": pushed}, now).mutations
    for _ in range(0, completed, 500):
        muts += engine.apply({"cmd": "PULLB", "queue": "old", "count": 500}, now + 1).mutations
    more = [{"data": -i} for i in range(waiting)]
    muts += engine.apply({"cmd": "PUSHB", "queue": "old", "jobs": more}, now + 2).mutations
    # The completions go to disk directly: an older engine never deleted the evicted rows.
    muts += [
        ("upd", job.key, {"state": "completed", "completedAt": now + 3})
        for job in engine.jobs.values()
        if job.state == "active"
    ]
    with Store.open(path) as store:
        store.apply(muts)


def test_recovery_loads_the_retained_window_and_deletes_stale_rows(
    shardq_server: Factory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _write_legacy_database(data / "shardq.db", completed=1500, waiting=300)
    assert rows_by_state(data / "shardq.db") == {"completed": 1500, "waiting": 300}
    env = {"SHARDQ_ENGINE_MAX_COMPLETED": str(CAP)}
    server = shardq_server(shards=2, env=env)
    recovered = [line for line in server.logs() if line.get("event") == "shard recovered"]
    # Both shards together read the live jobs and one window of completed ones, not 1,800 rows.
    assert sum(int(line["jobs"]) for line in recovered) == 300 + CAP
    deleted = server.find_log("stale completed rows deleted")
    assert deleted is not None and deleted["rows"] == 1500 - CAP
    wait_for_rows(server.data_path, {"completed": CAP, "waiting": 300})
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        counts = conn.call({"cmd": "GetJobCounts", "queue": "old"})["counts"]
        assert counts["completed"] == CAP and counts["waiting"] == 300
    assert server.stop() == 0


def _write_backlog(path: Path, jobs: int) -> None:
    engine = Engine(seed=3)
    with Store.open(path) as store:
        for start in range(0, jobs, 10_000):
            entries = [{"data": {"i": i}} for i in range(start, min(start + 10_000, jobs))]
            cmd = {"cmd": "PUSHB", "queue": "backlog", "jobs": entries}
            store.apply(engine.apply(cmd, 1_700_000_000_000).mutations)
            engine.jobs.clear()  # only the rows are wanted; keep the test's memory flat


def test_a_shard_recovering_longer_than_the_ready_timeout_is_not_killed(
    shardq_server: Factory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    jobs = BACKLOG
    _write_backlog(data / "shardq.db", jobs)
    # The shortest bound there is: 200,000 jobs recovered in 1.6 to 2.8 s here (faster than
    # when this was written), no longer surely past 3 s or even 1.5 s; progress is still
    # reported to the supervisor every 0.25 s, well inside 1 s.
    timeout_ms = 1000
    server = shardq_server(shards=1, start=False, env={"SHARDQ_READY_TIMEOUT_MS": str(timeout_ms)})
    server.start(timeout=180)
    recovered = server.find_log("shard recovered")
    assert recovered is not None and recovered["jobs"] == jobs
    # The recovery outlasted the bound: only its progress reports kept it alive.
    assert recovered["ms"] > timeout_ms, recovered
    progress = [line for line in server.logs() if line.get("event") == "shard recovering"]
    # Lines logged during the set-up reads say 0 loaded; under load one may fall at the end.
    loaded = [line["loaded"] for line in progress]
    assert all(0 <= n <= jobs for n in loaded) and loaded == sorted(loaded), loaded
    # The log shows progress every LOG_PROGRESS_EVERY_S (the supervisor hears it every 0.25 s):
    # a recovery that long has logged at least once.
    if recovered["ms"] >= LOG_PROGRESS_EVERY_S * 1000 + 250:
        assert loaded, recovered
    assert server.find_log("child neither ready nor progressing in time; killing it") is None
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        assert conn.call({"cmd": "Count", "queue": "backlog"})["count"] == jobs
    assert server.stop() == 0


def test_a_shard_that_stops_making_progress_is_killed(
    shardq_server: Factory, tmp_path: Path
) -> None:
    env = {"SHARDQ_READY_TIMEOUT_MS": str(READY_TIMEOUT_MS)}
    server, started = _recovering(shardq_server, tmp_path, env)
    server.wait_for_log("shard recovering", timeout=120)
    # A shard that hangs mid-recovery: it neither reports ready nor progress any more.
    os.kill(int(started["child_pid"]), signal.SIGSTOP)
    assert server.wait_exit(timeout=60) == 1
    failure = server.find_log("shardq is stopping after a failure")
    assert failure is not None
    assert "shard-0 did not report ready or progress within 3 s" in failure["reason"]


def _recovering(
    shardq_server: Factory, tmp_path: Path, env: dict[str, str]
) -> tuple[ShardqServer, dict[str, Any]]:
    """A one-shard server started on a backlog of BACKLOG jobs, not waited for: the server
    and the log line of its shard's start (`child_pid`)."""
    data = tmp_path / "data"
    data.mkdir()
    _write_backlog(data / "shardq.db", BACKLOG)
    server = shardq_server(shards=1, start=False, env=env)
    server.start(wait=False)
    return server, server.wait_for_log("child started", timeout=60, child="shard-0")


def _catches_sigterm(pid: int) -> bool:
    """Whether `pid` installed its SIGTERM handler (bit 15 of SigCgt in /proc): a child
    stopped before that dies of the signal, which counts as an unclean stop."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def _children(pid: int) -> set[int]:
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def test_a_stop_during_recovery_ends_the_front_end_waiting_for_its_turn(
    shardq_server: Factory, tmp_path: Path
) -> None:
    server, shard = _recovering(shardq_server, tmp_path, {})
    writer = server.find_log("child started", child="writer")
    assert writer is not None
    # The front end is spawned once the shard runs: it imports its modules, then waits for
    # its spec (stdin), which the supervisor writes only once every shard is ready.
    known = {int(shard["child_pid"]), int(writer["child_pid"])}
    waiting: set[int] = poll_until(
        lambda: _children(server.pid) - known, 30, "the front end to be spawned"
    )
    assert len(waiting) == 1, waiting
    poll_until(lambda: _catches_sigterm(int(shard["child_pid"])), 30, "the shard's SIGTERM handler")
    assert server.find_log("shard recovered") is None  # still recovering: the stop comes now
    assert server.stop() == 0  # what was never handed its spec does not fail the stop
    events = [(line["event"], line.get("child")) for line in server.logs()]
    assert ("child stopped before its start", "frontend") in events
    assert ("child started", "frontend") not in events
    assert not any(Path(f"/proc/{pid}").exists() for pid in waiting)
