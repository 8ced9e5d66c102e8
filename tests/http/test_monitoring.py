"""/health, /ready, liveness, /stats, JSON /metrics and the Prometheus scrape, on a real server."""

from __future__ import annotations

import re
from pathlib import Path

from http_helpers import get, request
from prometheus_client.parser import text_string_to_metric_families
from shardq_harness import ShardqServer

import shardq

STATES = {"waiting", "active", "delayed", "completed", "dlq"}


def scrape(server: ShardqServer, path: str = "/prometheus", **kwargs: object) -> dict[str, float]:
    """Every sample of one scrape, by name and labels: `name{label="v"}` -> value."""
    answer = get(server.http_url, path, **kwargs)  # type: ignore[arg-type]
    assert answer.status == 200, answer.text
    assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(answer.text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_health_shape(server: ShardqServer) -> None:
    answer = get(server.http_url, "/health")
    assert answer.status == 200, answer.text
    body = answer.json
    assert (body["ok"], body["status"], body["version"]) == (True, "healthy", shardq.__version__)
    assert isinstance(body["uptime"], int) and body["uptime"] >= 0
    assert set(body["queues"]) == STATES
    assert set(body["connections"]) == {"tcp", "ws", "sse"}
    roles = sorted(p["role"] for p in body["processes"])
    # Two shards; every process of the tree, each with its own resident memory.
    assert roles == ["frontend", "http", "shard", "shard", "supervisor", "writer"]
    assert all(p["rss"] > 1 for p in body["processes"])
    assert body["memory"]["rss"] >= sum(p["rss"] for p in body["processes"]) - 1
    storage = body["storage"]
    assert (storage["degraded"], storage["diskFull"], storage["error"]) == (False, False, None)
    assert storage["databaseBytes"] == Path(server.data_path).stat().st_size
    assert storage["backend"] == "sqlite"


def test_liveness_and_readiness(server: ShardqServer) -> None:
    for path in ("/healthz", "/live"):
        answer = get(server.http_url, path)
        assert (answer.status, answer.text) == (200, "OK")
    ready = get(server.http_url, "/ready")
    assert (ready.status, ready.json) == (200, {"ok": True, "ready": True})


def test_prometheus_scrape_parses_and_counters_move(server: ShardqServer) -> None:
    before = scrape(server)
    for n in range(3):
        # Durable: the reply waits for the commit, so the writer has flushed by the scrape.
        body = {"data": n, "durable": True}
        pushed = request(server.http_url, "POST", "/queues/prom-q/jobs", body)
        assert pushed.status == 200, pushed.text
    pulled = request(server.http_url, "GET", "/queues/prom-q/jobs")
    acked = request(server.http_url, "POST", f"/jobs/{pulled.json['job']['id']}/ack", {})
    assert acked.status == 200, acked.text
    after = scrape(server)
    assert after["bunqueue_jobs_pushed_total"] - before["bunqueue_jobs_pushed_total"] == 3
    assert after["bunqueue_jobs_pulled_total"] - before["bunqueue_jobs_pulled_total"] == 1
    assert after["bunqueue_jobs_completed_total"] - before["bunqueue_jobs_completed_total"] == 1
    assert after['bunqueue_queue_jobs_waiting{queue="prom-q"}'] == 2
    assert after['bunqueue_queue_jobs_completed{queue="prom-q"}'] == 1
    assert after["bunqueue_queue_metrics_omitted"] == 0
    assert after["bunqueue_sqlite_database_size_bytes"] > 0
    assert after["bunqueue_storage_degraded"] == 0
    roles = {k for k in after if k.startswith("shardq_process_resident_memory_bytes")}
    assert len(roles) == 6  # one series per process
    # The writer's flushes: a histogram whose +Inf bucket equals its count.
    count = after["shardq_writer_flush_duration_seconds_count"]
    assert count >= 1
    assert after['shardq_writer_flush_duration_seconds_bucket{le="+Inf"}'] == count
    # Two shards, each with a mailbox gauge (nothing waits on them between requests).
    assert {k: v for k, v in after.items() if k.startswith("shardq_shard_requests")} == {
        'shardq_shard_requests_in_flight{shard="0"}': 0,
        'shardq_shard_requests_in_flight{shard="1"}': 0,
    }
    # No head budget: every job in memory, none cold.
    assert after["shardq_head_jobs"] == 0
    resident = [after[f'shardq_shard_resident_jobs{{shard="{n}"}}'] for n in (0, 1)]
    assert sum(resident) >= 3 and after['shardq_shard_cold_jobs{shard="0"}'] == 0
    # Latency histograms counted by the front end: 3 pushes, 1 pull that delivered, 1 ACK.
    for command, moved in (("push", 3), ("pull", 1), ("ack", 1)):
        name = f"shardq_{command}_latency_seconds_count"
        assert after[name] - before.get(name, 0) == moved, command


def test_json_metrics_stats_and_prometheus_on_metrics(server: ShardqServer) -> None:
    metrics = get(server.http_url, "/metrics").json
    assert metrics["ok"] is True
    totals = {"totalPushed", "totalPulled", "totalCompleted", "totalFailed"}
    assert set(metrics["metrics"]) == totals
    stats = get(server.http_url, "/stats").json
    assert stats["ok"] is True
    assert {"waiting", "active", "dlq", "totalPushed", "pushPerSec"} <= set(stats["stats"])
    # A Prometheus server pointed at /metrics asks for text and gets the exposition format.
    text = scrape(server, "/metrics", headers={"Accept": "text/plain;version=0.0.4;q=1"})
    assert "bunqueue_jobs_pushed_total" in text


def _documented_metrics() -> set[str]:
    """The metric names of docs/http.md's Prometheus table, `{a,b}` alternatives expanded."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "http.md").read_text()
    table = text.split("### Prometheus metrics", 1)[1].split("\n\n#", 1)[0]
    names: set[str] = set()
    for cell in re.findall(r"^\| `([^|]+)` \|", table, flags=re.MULTILINE):
        for one in cell.split("`, `"):
            # A trailing `{queue}` or `{role,pid}` names labels; `_{a,b}` alternatives.
            one = re.sub(r"(?<!_)\{[a-z,]+\}$", "", one.strip("`"))
            names.update(_expand(one))
    return names


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\{([a-z0-9_]+(?:,[a-z0-9_]+)+)\}", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [n for part in match.group(1).split(",") for n in _expand(head + part + tail)]


def test_every_prometheus_family_is_in_the_docs_table(server: ShardqServer) -> None:
    # Each family /prometheus serves is listed in docs/http.md by the name a scrape shows
    # (a counter with its `_total`); a family added without its row fails here.
    answer = get(server.http_url, "/prometheus")
    assert answer.status == 200, answer.text
    served: set[str] = set()
    for family in text_string_to_metric_families(answer.text):
        served.add(f"{family.name}_total" if family.type == "counter" else family.name)
    documented = _documented_metrics()
    assert served - documented == set(), sorted(served - documented)
