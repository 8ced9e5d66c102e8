"""A real server upgrades a database from schema version 2 and recovers every job from it.

Rows are stored the same way in versions 2 and 3 (only the indexes differ), so the version 2
database is made by running the server, then putting back what version 2 had: its indexes and
its record in `migrations`. The next start migrates it (the writer does, before any shard
recovers) and must serve the same jobs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from shardq_harness import ShardqServer

from shardq.client import TcpConnection
from shardq.storage import Store, _schema

Factory = Callable[..., ShardqServer]
WAIT_S = 20.0


def _back_to_version_2(path: Path) -> None:
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DROP INDEX idx_jobs_queue")
        conn.execute("CREATE INDEX idx_jobs_queue_state_seq ON jobs (queue, state, seq)")
        conn.execute("CREATE INDEX idx_jobs_state ON jobs (state)")
        conn.execute("DROP TABLE cron_jobs")  # version 4
        conn.execute("DROP TABLE webhooks")  # version 5
        conn.execute("DROP TABLE flow_outbox")  # version 6
        conn.execute("DROP TABLE job_deltas")  # version 7
        conn.execute("DELETE FROM meta WHERE key = 'delta_encoding'")
        conn.execute("DROP TABLE queue_groups")  # version 8
        conn.execute("DROP TABLE drain_pending")  # version 13
        for trigger in ("delete", "update"):  # version 12: the cold counts' table (14: no
            conn.execute(f"DROP TRIGGER cold_counts_{trigger}")  # insert trigger)
        conn.execute("DROP TABLE cold_counts")
        for index in ("cold_made", "cold_by_seq"):  # version 11: `made` and its indexes
            conn.execute(f"DROP INDEX idx_jobs_{index}")
        conn.execute("ALTER TABLE jobs DROP COLUMN made")
        for index in ("seq", "cold_seq", "taken_seq"):  # version 10: the seq index in parts
            conn.execute(f"DROP INDEX idx_jobs_{index}")
        conn.execute("CREATE INDEX idx_jobs_seq ON jobs (seq)")
        for index in ("waiting", "group_waiting", "delayed", "unique"):  # version 9
            conn.execute(f"DROP INDEX idx_jobs_{index}")
        for column in ("cold", "lifo", "gid", "ukey"):
            conn.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
        conn.execute("DELETE FROM migrations WHERE version >= 3")
        conn.execute("COMMIT")
    conn.close()


def _states(conn: TcpConnection, ids: list[str]) -> dict[str, str]:
    replies = conn.call_many(({"cmd": "GetJob", "id": i} for i in ids), window=100)
    return {i: r["job"]["state"] for i, r in zip(ids, replies, strict=True)}


def test_a_version_2_database_is_upgraded_and_recovered(shardq_server: Factory) -> None:
    server = shardq_server(shards=2)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        ids: list[str] = []
        for queue in ("up-a", "up-b", "up-c"):
            jobs = [{"data": {"i": i}} for i in range(40)]
            reply = conn.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs, "durable": True})
            ids.extend(reply["ids"])
            pulled = conn.call({"cmd": "PULLB", "queue": queue, "count": 20, "owner": "w"})
            done = [job["id"] for job in pulled["jobs"]]
            conn.call({"cmd": "ACKB", "ids": done, "tokens": pulled["tokens"]})
        before = _states(conn, ids)
    assert server.stop() == 0, server.log_tail()
    assert sorted(before.values()).count("completed") == 60
    assert sorted(before.values()).count("waiting") == 60

    _back_to_version_2(server.data_path)
    with sqlite3.connect(server.data_path) as conn2:
        (version,) = conn2.execute("SELECT max(version) FROM migrations").fetchone()
    conn2.close()
    assert version == 2

    again = shardq_server(shards=2)
    with TcpConnection(*again.tcp_address, timeout=WAIT_S) as conn:
        assert _states(conn, ids) == before
        left = conn.call({"cmd": "PULLB", "queue": "up-a", "count": 100, "owner": "w"})
        assert len(left["jobs"]) == 20
    assert again.stop() == 0, again.log_tail()
    with Store.open(server.data_path) as store:
        info = store.describe()
    newest = len(_schema.MIGRATIONS)
    assert info.version == newest
    # v3's indexes, v9's partial ones (tests/storage/test_cold_store.py), v10's seq in three,
    # v11's two queue-wide cold reads; v12's cold counts table.
    assert ("queue",) in info.indexes["jobs"] and info.indexes["jobs"].count(("seq",)) == 3
    assert len(info.indexes["jobs"]) == 10
    assert "cold_counts" in info.columns
    assert "cron_jobs" in info.columns
