"""bunqueue-client 0.1.5 against `shardq start`: session, monitoring and auth.

Auth, Ping and Hello; Stats, Metrics and ListQueues; an `--auth-token` server that refuses every
command before `Auth`. Cron, queue limits, flows, webhooks, events and groups have their own
tests (test_compat_cron.py, test_compat_limits.py, test_compat_flows.py, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from bunqueue import AuthError, CommandError, Connection, Job, Queue
from compat_clients import Clients
from shardq_harness import ShardqServer, poll_until
from wire_clients import Tcp

pytestmark = pytest.mark.timeout(60)


def test_ping_and_hello(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    assert queue.ping() is True
    hello = queue.connection.hello()
    assert (hello["protocolVersion"], hello["server"]) == (2, "bunqueue")
    assert hello["capabilities"] == ["pipelining"]
    v3 = queue.connection.call({"cmd": "Hello", "protocolVersion": 3})
    assert v3["protocolVersion"] == 3 and "separate-job-name" in v3["capabilities"]


def test_v3_push_with_a_top_level_name(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    reply = queue.connection.call({"cmd": "PUSH", "queue": qname, "name": "v3", "data": {"k": 1}})
    raw = queue.connection.call({"cmd": "GetJob", "id": reply["id"]})["job"]
    assert raw["name"] == "v3" and raw["data"] == {"k": 1}


def test_stats_metrics_and_list_queues(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    before = queue.get_metrics()
    for i in range(5):
        queue.add("m", {"i": i})
    queue.add_bulk([{"name": "b", "attempts": 1}, {"name": "b", "attempts": 1}])
    ids: list[str] = []

    def process(job: Job) -> None:
        ids.append(job.id)
        if job.name == "b":
            raise ValueError("to the DLQ")

    queue.add("b", attempts=1)
    clients.worker(qname, process, concurrency=2)
    worker_queue = clients.queue(qname)
    poll_until(lambda: worker_queue.get_job_counts()["completed"] == 5, 10, "5 completed jobs")
    poll_until(lambda: worker_queue.get_job_counts()["failed"] == 3, 10, "3 failed jobs")
    metrics = queue.get_metrics()
    assert set(metrics) == {
        "totalPushed",
        "totalPulled",
        "totalCompleted",
        "totalFailed",
        "avgLatencyMs",
        "avgProcessingMs",
        "memoryUsageMb",
        "sqliteSizeMb",
        "activeConnections",
    }
    assert metrics["totalPushed"] - before["totalPushed"] == 8
    assert metrics["totalPulled"] - before["totalPulled"] == 8
    assert metrics["totalCompleted"] - before["totalCompleted"] == 5
    assert metrics["totalFailed"] >= 3
    assert metrics["avgLatencyMs"] > 0 and metrics["memoryUsageMb"] > 0
    stats = queue.get_stats()
    assert {"waiting", "active", "delayed", "completed", "failed", "dlq", "uptime"} <= set(stats)
    assert stats["completed"] >= 5 and stats["dlq"] >= 3
    assert qname in queue.list_queues()


def test_flow_children_reads_answer_empty(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    job = queue.add("lonely")
    assert queue.get_children_values(job.id) == {}
    assert queue.get_failed_children_values(job.id) == {}
    assert queue.get_ignored_children_failures(job.id) == {}
    assert Job({"id": job.id}, queue.connection).get_children_values() == {}


def test_auth_token_server(server_factory: Callable[..., ShardqServer]) -> None:
    server = server_factory(env={"AUTH_TOKENS": "s3cret,other"})
    host, port = server.tcp_address
    raw = Tcp(server.tcp_address)
    try:
        refused: list[dict[str, Any]] = [
            {"cmd": "Ping"},
            {"cmd": "Hello", "protocolVersion": 2},
            {"cmd": "PUSH", "queue": "q", "data": {"name": "x"}},
            {"cmd": "PULLB", "queue": "q", "count": 1, "owner": "w"},
            {"cmd": "GetJob", "id": "x"},
            {"cmd": "Stats"},
            {"cmd": "Metrics"},
            {"cmd": "ListQueues"},
            {"cmd": "RegisterWorker", "name": "w", "queues": ["q"]},
            {"cmd": "ListWorkers"},
            {"cmd": "Cron", "name": "c"},
            {"cmd": "NoSuchCommand"},
        ]
        for cmd in refused:
            assert raw.call(cmd) == {"ok": False, "error": "Not authenticated"}, cmd
        assert raw.call({"cmd": "Auth", "token": "wrong"}) == {
            "ok": False,
            "error": "Invalid token",
        }
        assert raw.call({"cmd": "Ping"})["error"] == "Not authenticated"
        assert raw.call({"cmd": "Auth", "token": "other"}) == {"ok": True}
        assert raw.call({"cmd": "Ping"})["data"]["pong"] is True
    finally:
        raw.close()

    with pytest.raises(AuthError, match="Invalid token"):
        Connection(host, port, token="wrong").connect()
    anonymous = Queue("authq", host=host, port=port)
    try:
        with pytest.raises(CommandError, match="Not authenticated"):
            anonymous.add("x")
    finally:
        anonymous.close()

    clients = Clients(server)
    try:
        queue = clients.queue("authq", token="s3cret")
        job = queue.add("secret", {"n": 7})
        clients.worker("authq", lambda j: j.data["n"] * 6, token="s3cret")
        assert queue.wait_for_job(job.id, 10_000) == 42
        assert [w["queues"] for w in queue.get_workers()] == [["authq"]]
    finally:
        clients.close()
