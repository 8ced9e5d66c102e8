"""`shardq storage copy`: a real server's SQLite file moved into PostgreSQL, then served.

A real server (tests/runtime/shardq_harness.py) fills its SQLite file with jobs in every
state, a flow, logs, a cron schedule, a webhook, a paused queue and a paused group; the copy
runs as the `shardq` command, and a server started on the PostgreSQL database
(`SHARDQ_STORAGE_URL`) must answer the same as the first did. The refusals (a running
server's file, a non-empty target, a missing file, a password in argv) exit 2 with one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pg_server import new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection
from shardq.storage import Store, open_postgres

NEEDS_POSTGRES = True

HOUR_MS = 3_600_000


def _copy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "SHARDQ_STORAGE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "shardq_cli.main", "storage", "copy", *args],
        capture_output=True, text=True, timeout=120, check=False, env={**clean, **(env or {})},
    )  # fmt: skip


def _fill(conn: TcpConnection) -> dict[str, str]:
    """Jobs in every state and the other kinds of stored data; their ids by role."""
    push = {"cmd": "PUSH", "durable": True}
    ids = {
        "waiting": conn.call({**push, "queue": "cp-a", "data": {"n": 1}})["id"],
        "delayed": conn.call({**push, "queue": "cp-a", "data": {"n": 2}, "delay": HOUR_MS})["id"],
        "custom": conn.call({**push, "queue": "cp-a", "data": {"n": 3}, "jobId": "my-id"})["id"],
        "grouped": conn.call({**push, "queue": "cp-g", "data": {}, "groupId": "g1"})["id"],
        "paused": conn.call({**push, "queue": "cp-p", "data": {"n": 4}})["id"],
    }
    for line in ("first line", "second line"):
        conn.call({"cmd": "AddLog", "id": ids["waiting"], "message": line})
    ids["completed"] = _finish(conn, "cp-done", {"data": {"n": 5}}, result={"sum": 42})
    ids["failed"] = _finish(conn, "cp-dlq", {"data": {"n": 6}, "maxAttempts": 1}, error="boom")
    ids["active"] = conn.call({**push, "queue": "cp-act", "data": {}})["id"]
    conn.call({"cmd": "PULL", "queue": "cp-act", "owner": "w", "timeout": 5000})
    # A flow parent on one queue, two children on another; one child completes with a value.
    nodes = [{"id": "par", "queue": "cp-a", "input": {"data": {}, "childrenIds": ["k1", "k2"]}}]
    nodes += [
        {"id": k, "queue": "cp-kids", "input": {"data": {"k": k}, "parentId": "par"}}
        for k in ("k1", "k2")
    ]
    conn.call({"cmd": "PUSHF", "jobs": nodes})
    ids["parent"], ids["child"] = "par", _ack_next(conn, "cp-kids", {"child": "done"})
    ids["other_child"] = "k2" if ids["child"] == "k1" else "k1"
    # The child's value reaches its parent's shard a moment later (a flow notice).
    values = {"cmd": "GetChildrenValues", "id": "par"}
    poll_until(lambda: conn.call(values)["data"]["values"], 10, "the parent's child value")
    conn.call({"cmd": "Pause", "queue": "cp-p"})
    conn.call({"cmd": "PauseGroup", "queue": "cp-g", "groupId": "g1"})
    cron = {"cmd": "Cron", "name": "yearly", "queue": "cp-a", "data": {"c": 1}}
    conn.call({**cron, "schedule": "0 3 1 1 *"})
    conn.call({"cmd": "AddWebhook", "url": "https://example.com/hook", "events": ["job.failed"]})
    return ids


def _finish(conn: TcpConnection, queue: str, opts: dict[str, Any], **how: Any) -> str:
    job_id = str(conn.call({"cmd": "PUSH", "queue": queue, "durable": True, **opts})["id"])
    if "result" in how:
        assert _ack_next(conn, queue, how["result"]) == job_id
    else:
        pulled = conn.call({"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 5000})
        fail = {"cmd": "FAIL", "id": job_id, "token": pulled["token"], "error": how["error"]}
        assert conn.call(fail)["ok"]
    return job_id


def _ack_next(conn: TcpConnection, queue: str, result: object) -> str:
    pulled = conn.call({"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 5000})
    job_id = str(pulled["job"]["id"])
    ack = {"cmd": "ACK", "id": job_id, "token": pulled["token"], "result": result}
    assert conn.call(ack)["ok"]
    return job_id


def _observe(conn: TcpConnection, ids: dict[str, str]) -> dict[str, Any]:
    """What a client sees of the stored data (the active job aside: a restart reclaims it)."""
    seen: dict[str, Any] = {
        role: conn.call({"cmd": "GetJob", "id": job_id})["job"]
        for role, job_id in ids.items()
        if role != "active"
    }
    seen["values"] = conn.call({"cmd": "GetChildrenValues", "id": ids["parent"]})["data"]
    seen["logs"] = conn.call({"cmd": "GetLogs", "id": ids["waiting"]})["data"]
    seen["crons"] = conn.call({"cmd": "CronList"})["crons"]
    seen["webhooks"] = conn.call({"cmd": "ListWebhooks"})["data"]["webhooks"]
    seen["counts"] = {
        q: conn.call({"cmd": "GetJobCounts", "queue": q})["counts"]
        for q in ("cp-a", "cp-g", "cp-p", "cp-done", "cp-dlq", "cp-kids")
    }
    group = {"queue": "cp-g", "groupId": "g1"}
    seen["group_paused"] = conn.call({"cmd": "PauseGroup", **group})["data"]["changed"]
    seen["queue_paused"] = conn.call({"cmd": "IsPaused", "queue": "cp-p"})["paused"]
    return seen


def test_a_servers_sqlite_file_is_copied_and_served_from_postgresql(tmp_path: Path) -> None:
    url = new_database("copy")
    source = ShardqServer(tmp_path / "sqlite", shards=2)
    with source:
        with TcpConnection(*source.tcp_address, timeout=15) as conn:
            ids = _fill(conn)
            before = _observe(conn, ids)
        # The file of a running server is refused, and the target stays empty.
        busy = _copy("--from", str(source.data_path), "--to", url)
        assert busy.returncode == 2, busy.stderr
        assert "in use by another shardq server" in busy.stderr
        assert "Traceback" not in busy.stderr
        assert source.stop() == 0
    with Store.open(source.data_path) as sqlite:
        counts = sqlite.row_counts()
        records = list(sqlite.load_jobs())
        queues, crons, hooks = sqlite.load_queues(), sqlite.load_crons(), sqlite.load_webhooks()
    assert counts["jobs"] == len(records) == 11
    assert counts["queue_state"] >= 1 and counts["queue_groups"] == 1
    assert counts["cron_jobs"] == counts["webhooks"] == 1

    done = _copy("--from", str(source.data_path), "--to", url, "--batch", "4", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verified"] is True and report["rows"] == sum(report["copied"].values())
    assert report["source"] == report["target"]
    assert {k: v for k, v in report["source"].items() if v} == {
        k: v for k, v in counts.items() if v
    }
    rows = report["rows"]
    assert rows == sum(counts[t] for t in report["copied"]) and rows > counts["jobs"]
    assert f"copied {rows} / {rows} rows (100%)" in done.stderr
    with open_postgres(url) as pg:
        assert list(pg.load_jobs()) == records
        assert (pg.load_queues(), pg.load_crons(), pg.load_webhooks()) == (queues, crons, hooks)

    # A second copy into the same database would merge: refused, nothing written.
    again = _copy("--from", str(source.data_path), "--to", url)
    assert again.returncode == 2, again.stderr
    assert "already holds data" in again.stderr and "Traceback" not in again.stderr
    with open_postgres(url) as pg:
        assert pg.row_counts() == report["target"]

    target = ShardqServer(tmp_path / "pg", shards=2, env={"SHARDQ_STORAGE_URL": url})
    with target, TcpConnection(*target.tcp_address, timeout=15) as conn:
        after = _observe(conn, ids)
    assert after == before
    assert before["completed"]["returnvalue"] == {"sum": 42}
    assert before["failed"]["state"] == "failed" and before["parent"]["state"] == "waiting-children"
    assert before["delayed"]["state"] == "delayed" and before["logs"]["count"] == 2
    assert list(before["values"]["values"].values()) == [{"child": "done"}]
    assert before["queue_paused"] is True and before["group_paused"] is False
    assert [c["name"] for c in before["crons"]] == ["yearly"] and len(before["webhooks"]) == 1


def test_a_missing_file_or_a_password_in_argv_is_refused(tmp_path: Path) -> None:
    missing = _copy("--from", str(tmp_path / "nope.db"), "--to", "postgresql://u@127.0.0.1:1/d")
    assert missing.returncode == 2, missing.stderr
    assert "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    assert not (tmp_path / "nope.db").exists()
    (tmp_path / "real.db").write_bytes(b"")
    secret = "postgresql://u:s3cret@127.0.0.1:1/d"
    argv = _copy("--from", str(tmp_path / "real.db"), "--to", secret)
    assert argv.returncode == 2 and "--to must not hold a password" in argv.stderr
    # From the environment the password is accepted (the server at port 1 is not there).
    env = _copy("--from", str(tmp_path / "real.db"), env={"SHARDQ_STORAGE_URL": secret})
    assert env.returncode == 1 and "cannot connect" in env.stderr, env.stderr
    assert "s3cret" not in env.stderr and "Traceback" not in env.stderr


def test_a_pending_drain_range_is_left_out_both_ways_with_postgresql(tmp_path: Path) -> None:
    """SQLite -> PostgreSQL and PostgreSQL -> SQLite (`copy_store`; the command copies the
    first way): a source with a Drain's range not deleted yet copies without its rows, and
    the counts agree."""
    from test_copy_store import _contents, _with_pending_range

    from shardq.storage._copy import copy_store

    url = new_database("copyd")
    with Store.open(tmp_path / "a.db") as sqlite, open_postgres(url) as pg:
        for mutation in _with_pending_range():
            sqlite.apply([mutation])
        result = copy_store(sqlite, pg, batch=5)
        assert result.mismatches() == [] and result.copied["jobs"] == 2
        assert _contents(pg) == _contents(sqlite)  # type: ignore[arg-type]
    url = new_database("copye")
    with open_postgres(url) as pg, Store.open(tmp_path / "b.db") as sqlite:
        for mutation in _with_pending_range():
            pg.apply([mutation])
        assert pg.pending_drains == {"qd": 31}
        result = copy_store(pg, sqlite, batch=5)
        assert result.mismatches() == [] and result.copied["jobs"] == 2
        assert result.source["jobs"] == 2 and "jobs:delayed" not in result.source
        assert _contents(sqlite) == _contents(pg)  # type: ignore[arg-type]
        assert sqlite.pending_drains == {}
