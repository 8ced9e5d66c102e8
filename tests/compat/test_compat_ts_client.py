"""bunqueue's own TypeScript client (`bunqueue/client`, run on Bun) against a real shardq.

Each test runs one script of `ts/` (see `bun_scripts.py`) and checks what it reports: `Queue`
with options, `Worker` with retries, `upsertJobScheduler`, a rate-limited worker, a default
`Worker` (which subscribes to events by itself), `QueueEvents` and `FlowProducer`.
"""

from __future__ import annotations

from itertools import combinations

from bun_scripts import run_script
from conftest import ShardqServer


def test_queue_options_and_numbers(shared_server: ShardqServer) -> None:
    """Job options come back as given, and times are plain numbers (`Date.now() - t` works)."""
    got = run_script("queue_options", shared_server.tcp_address[1])
    assert got["typeofTimestamp"] == "number" and got["typeofDelay"] == "number"
    assert 0 <= got["age"] < 60_000 and got["json"] is True
    assert got["isoDate"].startswith("20")
    assert got["plain"] == {"name": "plain", "data": {"n": 1}, "attempts": 4}
    assert got["rich"] == {"id": "ts-custom-1", "name": "rich", "priority": 7, "delay": 60_000}
    assert got["richState"] == "delayed"
    assert got["counts"]["waiting"] == 1 and got["counts"]["delayed"] == 1


def test_worker_retries_then_completes(shared_server: ShardqServer) -> None:
    """Two failures are retried, the third attempt completes at progress 100, no error event."""
    got = run_script("worker_retries", shared_server.tcp_address[1])
    assert got["done"] is True
    assert got["attemptsSeen"] == [0, 1, 2]
    assert got["failed"] == ["boom 1", "boom 2"]
    assert got["errors"] == []
    assert got["state"] == "completed"
    assert got["progress"] == 100
    assert got["returnvalue"]["ok"] is True
    assert got["completed"]["processedOn"] == "number"
    assert 0 <= got["finishedAge"] < 60_000


def test_upsert_job_scheduler(shared_server: ShardqServer) -> None:
    """A scheduler made by upsertJobScheduler pushes its template's jobs, is listed, and goes."""
    got = run_script("scheduler", shared_server.tcp_address[1])
    assert got["info"] == {"id": "ts-every", "every": 500, "nextIsNumber": True}
    assert got["enough"] is True
    assert got["seen"] == [{"name": "tick", "data": {"k": "v"}}] * 2
    assert got["listed"] == ["ts-every"]
    assert got["removed"] is True and got["after"] is None


def test_rate_limited_worker(shared_server: ShardqServer) -> None:
    """A queue limited to 2 per second: no 1 s window of the server's clock hands out a third
    job, all 6 run. (Where they start on the client depends on how long each reply took too:
    the first ones may cross the front end, later ones come from a shard that was handed the
    connection, several ms sooner on a loaded machine.)"""
    got = run_script("rate_limited", shared_server.tcp_address[1])
    assert got["done"] is True and got["errors"] == []
    assert len(got["starts"]) == 6
    pulled = sorted(got["pulled"])  # each job's processedOn: the server's startedAt
    assert len(pulled) == 6
    for a, b in combinations(range(6), 2):
        if b - a >= 2:  # three jobs a, .., b handed out inside one window break the limit
            assert pulled[b] - pulled[a] >= 1000, pulled


def test_default_worker_reports_no_error(shared_server: ShardqServer) -> None:
    """A Worker with default options subscribes to events at start: shardq answers, no error."""
    got = run_script("default_worker", shared_server.tcp_address[1])
    assert got["processed"] == 1
    assert got["errors"] == []


def test_queue_events_and_flow_producer(shared_server: ShardqServer) -> None:
    """QueueEvents sees completions; a FlowProducer tree runs its children before its parent."""
    got = run_script("events_flows", shared_server.tcp_address[1])
    assert got["done"] is True
    order = got["processed"]
    assert sorted(order) == ["child-a", "child-b", "parent", "single"]
    assert order.index("parent") > max(order.index("child-a"), order.index("child-b"))
    assert got["completedEvents"] >= 4
    assert got["parentState"] == "completed"
    assert got["eventErrors"] == [] and got["workerErrors"] == []
