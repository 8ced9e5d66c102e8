"""bunqueue's REST routes against a real server: every route once, each answering what the TCP
port answers for its command (docs/http.md)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
from http_helpers import Answer, request
from shardq_harness import ShardqServer

from shardq.runtime.http._rest import ROUTES, match

# The routes the tests of this module called, for the last test. Under pytest-xdist a module
# runs whole in one worker (`--dist loadfile` in pyproject.toml), so `_used` sees every call.
_used: set[tuple[str, str]] = set()


@pytest.fixture(scope="module")
def api(server: ShardqServer) -> Any:
    def call(method: str, path: str, body: Any = None, **kwargs: Any) -> Answer:
        found = match(method, path.split("?", 1)[0])
        if found is not None:
            _used.add((found[0].method, found[0].pattern.pattern))
        return request(server.http_url, method, path, body, **kwargs)

    return call


def ok(answer: Answer, status: int = 200) -> dict[str, Any]:
    assert answer.status == status, answer.text
    body: dict[str, Any] = answer.json
    assert body["ok"] is True, body
    assert "reqId" not in body  # the TCP envelope's field stays on the TCP port
    return body


def test_queue_routes(api: Any) -> None:
    one = ok(api("POST", "/queues/rest-q/jobs", {"name": "n", "data": {"a": 1}, "priority": 5}))
    two = ok(api("POST", "/queues/rest-q/jobs", {"data": 2, "delay": 60_000}))
    bulk = ok(api("POST", "/queues/rest-q/jobs/bulk", {"jobs": [{"data": 3}, {"data": 4}]}))
    assert len(bulk["ids"]) == 2
    assert "rest-q" in ok(api("GET", "/queues"))["queues"]
    summary = api("GET", "/queues/summary")
    assert summary.status == 200, summary.text
    mine = next(q for q in summary.json if q["name"] == "rest-q")  # a bare list, as bunqueue's
    assert mine["paused"] is False
    assert (mine["counts"]["waiting"], mine["counts"]["delayed"]) == (2, 1)
    counts = ok(api("GET", "/queues/rest-q/counts"))["counts"]
    assert (counts["prioritized"], counts["waiting"], counts["delayed"]) == (1, 2, 1)
    assert ok(api("GET", "/queues/rest-q/count"))["count"] == 4
    assert ok(api("GET", "/queues/rest-q/priority-counts"))["counts"]["5"] == 1
    listed = ok(api("GET", "/queues/rest-q/jobs/list?state=delayed&limit=10&offset=0"))["jobs"]
    assert [j["id"] for j in listed] == [two["id"]]
    ok(api("POST", "/queues/rest-q/pause"))
    assert ok(api("GET", "/queues/rest-q/paused"))["paused"] is True
    ok(api("POST", "/queues/rest-q/resume"))
    assert ok(api("POST", "/queues/rest-q/promote-jobs", {}))["count"] == 1
    pulled = ok(api("GET", "/queues/rest-q/jobs?timeout=0"))["job"]
    assert pulled["id"] == one["id"]  # the priority-5 job goes first
    batch = ok(api("POST", "/queues/rest-q/jobs/pull-batch", {"count": 2}))["jobs"]
    assert len(batch) == 2
    ok(api("POST", "/jobs/ack-batch", {"ids": [j["id"] for j in batch]}))
    ok(api("POST", f"/jobs/{pulled['id']}/ack", {"result": {"done": True}}))
    assert ok(api("POST", "/queues/rest-q/retry-completed", {"id": pulled["id"]}))["count"] == 1
    assert ok(api("POST", "/queues/rest-q/clean", {"state": "completed", "grace": 0}))["count"] == 2
    assert ok(api("POST", "/queues/rest-q/drain"))["count"] == 2
    ok(api("POST", "/queues/rest-q/obliterate"))
    assert ok(api("GET", "/queues/rest-q/counts"))["counts"]["waiting"] == 0


def test_queue_settings_routes(api: Any) -> None:
    ok(api("PUT", "/queues/set-q/stall-config", {"config": {"maxStalls": 7}}))
    assert ok(api("GET", "/queues/set-q/stall-config"))["config"]["maxStalls"] == 7
    ok(api("PUT", "/queues/set-q/dlq-config", {"maxEntries": 50}))
    assert ok(api("GET", "/queues/set-q/dlq-config"))["config"]["maxEntries"] == 50
    # Rate limit and concurrency cap (docs/protocol.md §16), set and cleared.
    for method, path, body in [
        ("PUT", "/queues/set-q/rate-limit", {"limit": 5}),
        ("DELETE", "/queues/set-q/rate-limit", None),
        ("PUT", "/queues/set-q/concurrency", {"limit": 5}),
        ("DELETE", "/queues/set-q/concurrency", None),
    ]:
        answer = api(method, path, body)
        assert answer.status == 200, (path, answer.text)
        assert answer.json["ok"] is True


def test_job_routes(api: Any) -> None:
    job = ok(api("POST", "/queues/job-q/jobs", {"data": {"v": 1}, "jobId": "custom-1"}))["id"]
    assert ok(api("GET", f"/jobs/{job}"))["job"]["data"] == {"v": 1}
    assert ok(api("GET", "/jobs/custom/custom-1"))["job"]["id"] == job
    assert ok(api("GET", f"/jobs/{job}/state"))["state"] == "waiting"
    ok(api("PUT", f"/jobs/{job}/data", {"data": {"v": 2}}))
    ok(api("PUT", f"/jobs/{job}/priority", {"priority": 3}))
    ok(api("PUT", f"/jobs/{job}/delay", {"delay": 60_000}))
    ok(api("POST", f"/jobs/{job}/promote"))
    ok(api("POST", f"/jobs/{job}/logs", {"message": "hello", "level": "warn"}))
    logs = ok(api("GET", f"/jobs/{job}/logs"))["data"]["logs"]
    assert [(line["level"], line["message"]) for line in logs] == [("warn", "hello")]
    ok(api("DELETE", f"/jobs/{job}/logs"))
    assert ok(api("GET", f"/jobs/{job}/children"))["data"] == {"values": {}}
    # With an owner a pull takes a lease (docs/protocol.md §6.1): the lock routes need one.
    leased = ok(api("POST", "/queues/job-q/jobs/pull-batch", {"count": 1, "owner": "me"}))
    assert [j["id"] for j in leased["jobs"]] == [job]
    token = leased["tokens"][0]
    ok(api("POST", f"/jobs/{job}/progress", {"progress": 40, "message": "m"}))
    assert ok(api("GET", f"/jobs/{job}/progress"))["progress"] == 40
    ok(api("POST", f"/jobs/{job}/heartbeat", {"token": token}))
    ok(api("POST", "/jobs/heartbeat-batch", {"ids": [job], "tokens": [token]}))
    ok(api("POST", f"/jobs/{job}/extend-lock", {"duration": 30_000, "token": token}))
    ok(api("POST", "/jobs/extend-locks", {"ids": [job], "tokens": [token], "durations": [30_000]}))
    ok(api("POST", f"/jobs/{job}/move-to-delayed", {"delay": 60_000, "token": token}))
    ok(api("POST", f"/jobs/{job}/move-to-wait"))  # delayed -> waiting
    assert ok(api("GET", "/queues/job-q/jobs"))["job"]["id"] == job
    ok(api("POST", f"/jobs/{job}/ack", {"result": 42}))
    assert ok(api("GET", f"/jobs/{job}/result"))["result"] == 42
    assert ok(api("POST", f"/jobs/{job}/wait", {"timeout": 1000}))["completed"] is True
    other = ok(api("POST", "/queues/job-q/jobs", {"data": 0}))["id"]
    ok(api("POST", f"/jobs/{other}/discard"))
    third = ok(api("POST", "/queues/job-q/jobs", {"data": 0}))["id"]
    ok(api("DELETE", f"/jobs/{third}"))
    missing = api("GET", f"/jobs/{third}")
    assert (missing.status, missing.json["ok"]) == (404, False)
    running = ok(api("POST", "/queues/job-q/jobs", {"data": 0}))["id"]
    ok(api("POST", "/queues/job-q/jobs/pull-batch", {"count": 1, "owner": "me"}))
    ok(api("POST", f"/jobs/{running}/cancel", {"reason": "from the API"}))
    cancelled = ok(api("GET", f"/jobs/{running}"))["job"]
    assert (cancelled["state"], cancelled["failedReason"]) == ("failed", "cancelled: from the API")


def test_dlq_routes(api: Any) -> None:
    job = ok(api("POST", "/queues/dlq-q/jobs", {"data": 1, "maxAttempts": 1}))["id"]
    ok(api("GET", "/queues/dlq-q/jobs"))
    ok(api("POST", f"/jobs/{job}/fail", {"error": "boom"}))
    dlq = ok(api("GET", "/queues/dlq-q/dlq?limit=10&offset=0"))
    assert [e["job"]["id"] for e in dlq["entries"]] == [job]
    stats = api("GET", "/queues/dlq-q/dlq/stats")
    assert stats.status in (200, 501), stats.text
    assert ok(api("POST", "/queues/dlq-q/dlq/retry", {"jobId": job}))["count"] == 1
    ok(api("GET", "/queues/dlq-q/jobs"))
    ok(api("POST", f"/jobs/{job}/fail", {"error": "boom again"}))
    assert ok(api("POST", "/queues/dlq-q/dlq/purge"))["count"] == 1
    # One entry removed (the dashboard's Remove of a failed job), then nothing left to remove.
    gone = ok(api("POST", "/queues/dlq-q/jobs", {"data": 2, "maxAttempts": 1}))["id"]
    ok(api("GET", "/queues/dlq-q/jobs"))
    ok(api("POST", f"/jobs/{gone}/fail", {"error": "boom"}))
    assert ok(api("DELETE", f"/queues/dlq-q/dlq/{gone}"))["data"] == {"removed": True}
    assert ok(api("DELETE", f"/queues/dlq-q/dlq/{gone}"))["data"] == {"removed": False}
    assert api("GET", f"/jobs/{gone}").status == 404


def test_worker_routes(api: Any) -> None:
    body = {"name": "w", "queues": ["q"], "workerId": "w-1", "concurrency": 2}
    assert ok(api("POST", "/workers", body))["data"]["workerId"] == "w-1"
    ok(api("POST", "/workers/w-1/heartbeat", {"activeJobs": 1}))
    workers = ok(api("GET", "/workers"))["data"]["workers"]
    assert "w-1" in [w["id"] for w in workers]  # the session's server may have others
    ok(api("DELETE", "/workers/w-1"))
    assert "w-1" not in [w["id"] for w in ok(api("GET", "/workers"))["data"]["workers"]]
    assert ok(api("GET", "/ping"))


def test_cron_routes(api: Any) -> None:
    body = {"name": "http-c", "queue": "cron-q", "schedule": "0 0 1 1 *", "data": {"n": 1}}
    assert ok(api("POST", "/crons", body))
    listed = ok(api("GET", "/crons"))["crons"]
    assert [c["name"] for c in listed] == ["http-c"]
    assert ok(api("GET", "/crons/http-c"))
    ok(api("DELETE", "/crons/http-c"))
    assert ok(api("GET", "/crons"))["crons"] == []


def test_webhook_routes(api: Any) -> None:
    # This server does not allow private targets, and the machine resolves no public name, so
    # every add is refused; a delivered webhook is in tests/runtime/test_webhooks_server.py.
    refused = api("POST", "/webhooks", {"url": "http://127.0.0.1:1/", "events": ["job.pushed"]})
    assert refused.status == 400 and "loopback address" in refused.json["error"]
    listed = ok(api("GET", "/webhooks"))["data"]
    assert listed == {"webhooks": [], "stats": {"total": 0, "enabled": 0}}
    for method, path, body in [
        ("DELETE", "/webhooks/nope", None),
        ("PUT", "/webhooks/nope/enabled", {"enabled": False}),
    ]:
        answer = api(method, path, body)
        assert (answer.status, answer.json) == (400, {"ok": False, "error": "Webhook not found"})


def test_storage_status_route(api: Any) -> None:
    assert ok(api("GET", "/storage")) == {
        "ok": True,
        "data": {"diskFull": False, "error": None, "since": None},
    }


def test_cluster_route_on_sqlite_is_this_node_alone(api: Any, server: ShardqServer) -> None:
    # Without PostgreSQL a node is alone: it holds every partition (docs/cluster.md).
    answer = ok(api("GET", "/cluster"))
    node = f"{socket.gethostname()}:{server.tcp_port}"
    me = {"id": node, "address": f"127.0.0.1:{server.tcp_port}", "alive": True, "partitions": 256}
    assert answer == {"ok": True, "nodes": [me], "partitions": 256, "forwards": 0}


def test_unknown_paths_and_bad_bodies(api: Any, server: ShardqServer) -> None:
    for method, path in [("GET", "/nope"), ("POST", "/queues"), ("GET", "/queues/q/nope")]:
        answer = api(method, path)
        assert (answer.status, answer.json) == (404, {"ok": False, "error": "Not found"})
    req = urllib.request.Request(
        server.http_url + "/queues/q/jobs", data=b"{not json", method="POST"
    )
    req.add_header("Content-Type", "application/json")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 400
    assert json.loads(refused.value.read()) == {"ok": False, "error": "Invalid JSON body"}


def test_dashboard_json_routes(api: Any, server: ShardqServer) -> None:
    ok(api("POST", "/queues/board-q/jobs", {"data": 1, "priority": 2}))
    ok(api("POST", "/queues/board-q/jobs", {"data": 2, "delay": 60_000}))
    overview = ok(api("GET", "/dashboard"))
    assert {"stats", "throughput", "latency", "memory", "workers", "crons", "storage"} <= set(
        overview
    )
    assert overview["stats"]["totalPushed"] >= 2 and overview["memory"]["rss"] > 0
    assert overview["latency"]["averages"]["push"] > 0
    page = ok(api("GET", "/dashboard/queues?limit=1000&offset=0"))
    mine = next(q for q in page["queues"] if q["name"] == "board-q")
    assert (mine["waiting"], mine["delayed"], mine["paused"]) == (0, 1, False)
    assert page["total"] >= len(page["queues"]) and page["limit"] == 1000
    detail = ok(api("GET", "/dashboard/queues/board-q?includeJobs=true"))
    assert (detail["name"], detail["counts"]["prioritized"]) == ("board-q", 1)
    assert detail["priorityCounts"] == {"0": 1, "2": 1}
    assert len(detail["jobs"]["delayed"]) == 1 and set(detail["jobs"]["delayed"][0]) == {
        "id", "priority", "createdAt", "runAt", "attempts", "progress"
    }  # fmt: skip
    history = api("GET", "/dashboard/history?queue=board-q&minutes=3")
    assert history.status == 200 and len(history.json["points"]) == 3, history.text
    assert sum(p["pushed"] for p in history.json["points"]) == 2
    found = api("GET", f"/dashboard/search?q={detail['jobs']['delayed'][0]['id']}")
    assert found.status == 200 and found.json["jobs"], found.text


def test_every_route_was_called() -> None:
    """Runs last in this module: each route of the table was exercised above."""
    missing = {(r.method, r.pattern.pattern) for r in ROUTES} - _used
    assert not missing, sorted(missing)
