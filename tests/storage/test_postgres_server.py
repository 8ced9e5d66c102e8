"""`shardq start` storing in PostgreSQL (`storage_url`): a durable push survives `kill -9` of
the whole process tree, read back from the database by the restarted server.

The real server (tests/runtime/shardq_harness.py) on the tests' PostgreSQL server
(`pg_server`), in a database of its own; deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
from pg_server import new_database, shared_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, free_port

from shardq.client import TcpConnection

NEEDS_POSTGRES = True


def test_a_durable_push_survives_kill_9_in_postgresql(tmp_path: Path) -> None:
    url = new_database("node")
    # The test server trusts every local login and ignores the password: it is there to show
    # that no log line carries it.
    user = shared_server().superuser
    with_password = url.replace(f"postgresql://{user}@", f"postgresql://{user}:pw-x9@")
    assert with_password != url
    server = ShardqServer(tmp_path, shards=1, env={"SHARDQ_STORAGE_URL": with_password})
    with server:  # started
        assert server.find_log("writer ready", data_path=url) is not None
        assert "pw-x9" not in server.raw_log()
        with TcpConnection(*server.tcp_address, timeout=15) as conn:
            pushed = conn.call({"cmd": "PUSH", "queue": "pg", "data": {"n": 1}, "durable": True})
        server.kill9_tree()
        # The job is in PostgreSQL, and the SQLite file at data_path was never made.
        with psycopg.connect(url) as db:
            rows = db.execute("SELECT id, queue, state FROM jobs").fetchall()
        assert rows == [(pushed["id"], "pg", "waiting")]
        assert not server.data_path.exists()
        server.start()
        with TcpConnection(*server.tcp_address, timeout=15) as conn:
            job = conn.call({"cmd": "GetJob", "id": pushed["id"]})["job"]
            pulled = conn.call({"cmd": "PULL", "queue": "pg", "timeout": 0})["job"]
    assert job["data"] == {"n": 1} and job["state"] == "waiting"
    assert pulled["id"] == pushed["id"]


def test_a_password_on_the_command_line_is_refused(tmp_path: Path) -> None:
    # A command line is readable by every local user (as for --auth-token).
    url = "postgresql://shardq:s3cret@127.0.0.1:1/shardq"
    done = subprocess.run(
        [sys.executable, "-m", "shardq_cli.main", "start", "--storage-url", url],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--storage-url must not hold a password" in done.stderr
    assert not (tmp_path / "data").exists()


def test_a_backup_asked_of_a_server_on_postgresql_is_refused(tmp_path: Path) -> None:
    # shardq's backups copy the SQLite file, which a server on PostgreSQL never writes.
    env = {"SHARDQ_STORAGE_URL": new_database("node"), "SHARDQ_BACKUP_DIR": str(tmp_path / "b")}
    server = ShardqServer(tmp_path / "data", shards=1, env=env)
    with server, TcpConnection(*server.tcp_address, timeout=15) as conn:
        reply = conn.call({"cmd": "Backup", "action": "now"}, check=False)
        listed = conn.call({"cmd": "Backup", "action": "list"})
    assert reply["ok"] is False
    assert "backed up with PostgreSQL's own tools" in reply["error"]
    assert listed["ok"] is True and listed["backups"] == []
    assert not any((tmp_path / "b").glob("*.gz"))


def _health(server: ShardqServer) -> dict[str, Any]:
    # 503 while degraded carries the same body; a healthy server answers 200.
    with urllib.request.urlopen(f"{server.http_url}/health", timeout=10) as answer:
        body: dict[str, Any] = json.loads(answer.read())
    return body


def test_health_reports_the_postgresql_database_size(tmp_path: Path) -> None:
    # There is no SQLite file to stat: the writer reads pg_database_size for /health.
    url = new_database("node")
    env = {"SHARDQ_STORAGE_URL": url}
    server = ShardqServer(tmp_path, shards=1, env=env, http_port=free_port())
    with server, TcpConnection(*server.tcp_address, timeout=15) as conn:
        conn.call({"cmd": "PUSH", "queue": "pg", "data": {"n": 1}, "durable": True})
        deadline = time.monotonic() + 20
        storage = _health(server)["storage"]
        while storage["databaseBytes"] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            storage = _health(server)["storage"]
        with psycopg.connect(url) as db:
            row = db.execute("SELECT pg_database_size(current_database())").fetchone()
    assert row is not None
    assert storage["backend"] == "postgresql"
    assert storage["walBytes"] == 0
    # Read at most 10 s apart; a database with one job barely grows meanwhile.
    assert 0.8 * row[0] <= storage["databaseBytes"] <= 1.2 * row[0]
    assert not server.data_path.exists()
