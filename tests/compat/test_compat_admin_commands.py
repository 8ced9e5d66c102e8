"""The admin and monitoring commands on a real two-shard server, as a bunqueue peer sends them:
queue-scoped Metrics and the dedup/DLQ commands reach the queue's shard, id-only commands find
their job on either shard, and the monitoring commands answer in bunqueue's `data` shapes
(docs/protocol.md §21)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import ShardqServer

from shardq.client import Connection

QUEUES = [f"admin-q{i}" for i in range(6)]  # spread over both shards


@pytest.fixture
def conn(shared_server: ShardqServer) -> Iterator[Connection]:
    host, port = shared_server.tcp_address
    connection = Connection(f"tcp://{host}:{port}")
    try:
        yield connection
    finally:
        connection.close()


def call(conn: Connection, **cmd: Any) -> dict[str, Any]:
    reply: dict[str, Any] = conn.call_many([cmd], check=False)[0]
    reply.pop("reqId", None)
    return reply


def test_queue_commands_reach_the_queues_shard(conn: Connection) -> None:
    for q in QUEUES:
        job = call(conn, cmd="PUSH", queue=q, data={}, uniqueKey="u", maxAttempts=1)["id"]
        assert call(conn, cmd="GetDeduplicationJobId", queue=q, deduplicationId="u")["data"] == {
            "jobId": job
        }
        token = call(conn, cmd="PULL", queue=q, owner="w")["token"]
        call(conn, cmd="FAIL", id=job, token=token, error="x")
        assert call(conn, cmd="GetDlqStats", queue=q)["data"]["stats"]["total"] == 1
        metrics = call(conn, cmd="Metrics", queue=q, type="failed")["data"]
        assert metrics["meta"]["count"] == 1 and metrics["data"] == [1]
        assert call(conn, cmd="RemoveDlqJob", queue=q, jobId=job)["data"] == {"removed": True}


def test_id_commands_find_the_job_on_any_shard(conn: Connection) -> None:
    for q in QUEUES:
        job = call(conn, cmd="PUSH", queue=q, data={}, uniqueKey=f"id-{q}")["id"]
        assert call(conn, cmd="RemoveJobDeduplicationKey", id=job)["data"] == {"removed": True}
        assert call(conn, cmd="RemoveJobDeduplicationKey", id=job)["data"] == {"removed": False}
        assert call(conn, cmd="MoveToDelayed", id=job, delay=60_000) == {"ok": True}
        assert call(conn, cmd="GetState", id=job)["state"] == "delayed"


def test_legacy_metrics_still_answered_by_the_front_end(conn: Connection) -> None:
    reply = call(conn, cmd="Metrics")
    assert set(reply["metrics"]) >= {"totalPushed", "totalPulled", "memoryUsageMb"}


def test_monitoring_commands(conn: Connection) -> None:
    call(conn, cmd="PUSH", queue="admin-mon", data={})
    prometheus = call(conn, cmd="Prometheus")["data"]["metrics"]
    assert "# TYPE" in prometheus and "bunqueue_jobs_waiting" in prometheus
    storage = call(conn, cmd="StorageStatus")["data"]
    assert storage == {"diskFull": False, "error": None, "since": None}
    assert call(conn, cmd="CompactMemory") == {"ok": True}
    overview = call(conn, cmd="DashboardOverview")["data"]
    assert overview["stats"]["waiting"] >= 1 and "workers" in overview and "timestamp" in overview
    queues = call(conn, cmd="DashboardQueues")["data"]["queues"]
    assert any(q["name"] == "admin-mon" and q["waiting"] == 1 for q in queues)
    detail = call(conn, cmd="DashboardQueue", queue="admin-mon", includeJobs=True)["data"]
    assert detail["name"] == "admin-mon" and detail["counts"]["waiting"] == 1
    assert len(detail["jobs"]["waiting"]) == 1
    assert call(conn, cmd="DashboardQueue") == {"ok": False, "error": "Queue name is required"}
