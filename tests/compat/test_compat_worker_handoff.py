"""bunqueue-client 0.1.5's `Worker` handed to its shard (`tcp_handoff`, docs/runtime.md
"Handed-off connections"): it registers itself (`RegisterWorker`) and sends `Heartbeat` and
`JobHeartbeatB` every `heartbeat_interval_s`, which used to keep its connection in the front end.

Real servers, the real client. Where the connection is served is read from Stats: `handedOff`
and `handedBack` (connections taken and given back by the shards) and `directPulled` /
`directCompleted` (jobs pulled and completed on handed-off connections).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from bunqueue import Job
from compat_clients import Clients
from shardq_harness import ShardqServer, poll_until
from test_compat_handoff import ENV, WAIT_S, _announced, _queue_on, _stats

from shardq.client._tcp import TcpConnection

pytestmark = pytest.mark.timeout(180)

Factory = Callable[..., ShardqServer]


def _call(server: ShardqServer, cmd: dict[str, Any]) -> dict[str, Any]:
    with TcpConnection(*server.tcp_address) as conn:
        reply: dict[str, Any] = conn.call(cmd)
        return reply


def _fill(server: ShardqServer, queue: str, jobs: list[dict[str, Any]]) -> list[str]:
    reply = _call(server, {"cmd": "PUSHB", "queue": queue, "jobs": jobs})
    assert reply["ok"] is True, reply
    ids: list[str] = reply["ids"]
    return ids


def _workers(server: ShardqServer) -> dict[str, dict[str, Any]]:
    listed = _call(server, {"cmd": "ListWorkers"})["data"]["workers"]
    return {w["id"]: w for w in listed}


def _handed_now(server: ShardqServer) -> int:
    stats = _stats(server)
    return int(stats["handedOff"] - stats["handedBack"])


def _started(factory: Factory) -> tuple[ShardqServer, Clients]:
    server = factory(shards=2, env=ENV)
    _announced(server)
    return server, Clients(server)


def test_a_registered_worker_drains_through_its_shard_and_is_listed(
    server_factory: Factory,
) -> None:
    server, clients = _started(server_factory)
    queue = _queue_on(1, "wdrain")
    ids = _fill(server, queue, [{"name": "n", "data": {"i": i}} for i in range(600)])
    ran: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def process(job: Job) -> None:
        time.sleep(0.01)  # jobs flow for a few seconds: heartbeats come meanwhile
        with lock:
            ran[job.id] += 1

    try:
        worker = clients.worker(queue, process, concurrency=5, heartbeat_interval_s=0.2)

        def listed_while_handed() -> dict[str, Any] | None:
            seen = _workers(server).get(worker.worker_id)
            if seen is None or not seen["processedJobs"] or _handed_now(server) != 1:
                return None
            return seen

        # Its Heartbeats' counters reach the registry while its shard serves it.
        seen = poll_until(listed_while_handed, WAIT_S, "the worker listed while handed off")
        assert seen["queues"] == [queue] and seen["concurrency"] == 5, seen
        assert seen["status"] == "active"
        poll_until(lambda: len(ran) == len(ids), 60.0, "the drain")
        assert set(ran) == set(ids) and set(ran.values()) == {1}  # every job once
        stats = _stats(server)
        # Most through its shard (each Heartbeat takes it back for a few requests).
        assert stats["directPulled"] >= len(ids) // 2, stats
        assert stats["directCompleted"] >= len(ids) // 2, stats
        assert stats["handedOff"] >= 2, stats  # again after a Heartbeat took it back
        poll_until(
            lambda: _workers(server)[worker.worker_id]["processedJobs"] == len(ids),
            WAIT_S,
            "the last counters heartbeated",
        )
        worker.close(timeout=10)  # its UnregisterWorker, then its close
        assert worker.worker_id not in _workers(server)
    finally:
        clients.close()


_WORKER_SCRIPT = """
import sys, threading, time
from bunqueue import Worker
def slow(job):
    time.sleep(0.05)
w = Worker(sys.argv[1], slow, host="127.0.0.1", port=int(sys.argv[2]), concurrency=5,
           heartbeat_interval_s=60, poll_timeout_ms=300)
print(w.worker_id, flush=True)
threading.Event().wait()
"""


def test_a_handed_off_workers_end_takes_it_out_of_the_registry(
    server_factory: Factory,
) -> None:
    server, _clients = _started(server_factory)
    queue = _queue_on(1, "wkill")
    _fill(server, queue, [{"name": "n", "data": {"i": i}} for i in range(2000)])
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER_SCRIPT, queue, str(server.tcp_address[1])],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        worker_id = proc.stdout.readline().strip()
        poll_until(
            lambda: worker_id in _workers(server) and _handed_now(server) == 1,
            WAIT_S,
            "the worker registered and handed off",
        )
        # No Heartbeat before a minute: its shard holds it now. Killed, it sends no
        # UnregisterWorker: only its connection ends, at the shard.
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(WAIT_S)
        poll_until(lambda: worker_id not in _workers(server), WAIT_S, "the worker forgotten")
        # Its jobs in hand went back to waiting.
        counts = _call(server, {"cmd": "GetJobCounts", "queue": queue})["counts"]
        assert counts["active"] == 0, counts
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT_S)


def test_heartbeats_keep_a_handed_off_workers_long_job(server_factory: Factory) -> None:
    server, clients = _started(server_factory)
    queue = _queue_on(1, "wlong")
    # A few rounds of pulls (the Worker pulls three, waits 50 ms while its slots are busy).
    jobs = [{"name": "fast", "data": {"i": i}} for i in range(9)]
    ids = _fill(server, queue, [*jobs, {"name": "slow", "data": {"slow": True}}])
    ran: collections.Counter[str] = collections.Counter()

    def process(job: Job) -> None:
        ran[job.id] += 1
        slow = isinstance(job.data, dict) and job.data.get("slow") is True
        time.sleep(6.0 if slow else 0.005)  # slow: over two lease lengths

    try:
        # Handed off after its first pull and acks, it pulls the slow job on its shard; its
        # first Heartbeat takes it back, and its next long-poll, parked in the front end on
        # the empty queue, keeps it there: its JobHeartbeatBs renew the lease the shard's
        # engine holds under the connection's id.
        clients.worker(queue, process, concurrency=3, lock_ttl_ms=2_500, heartbeat_interval_s=0.8)
        poll_until(lambda: len(ran) == len(ids), WAIT_S, "every job started")
        poll_until(
            lambda: _call(server, {"cmd": "GetState", "id": ids[-1]}).get("state") == "completed",
            WAIT_S,
            "the slow job done",
        )
        assert set(ran.values()) == {1}, ran  # the slow one too: its lease never lapsed
        assert _call(server, {"cmd": "GetJob", "id": ids[-1]})["job"]["attempts"] == 0
        stats = _stats(server)
        assert stats["handedOff"] >= 1 and stats["directPulled"] >= 1, stats
    finally:
        clients.close()


def test_a_worker_past_its_heartbeats_is_served_by_its_shard_again(
    server_factory: Factory,
) -> None:
    """Each Heartbeat takes the connection back to the front end, whose answer used to keep it
    there while the Worker's long-poll waited on the empty queue: now it goes back to its
    shard at once (that long-poll answered empty, as its timeout would)."""
    # Handed off after 50 requests for its shard: its first jobs' acks and pulls earn that,
    # its pulls on the empty queue (one a second) would take most of a minute.
    server = server_factory(shards=2, env={**ENV, "SHARDQ_TCP_HANDOFF_AFTER": "50"})
    _announced(server)
    clients = Clients(server)
    queue = _queue_on(1, "wstay")
    first = _fill(server, queue, [{"name": "n", "data": {"i": i}} for i in range(60)])
    ran: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def process(job: Job) -> None:
        with lock:
            ran[job.id] += 1

    try:
        worker = clients.worker(
            queue, process, concurrency=5, heartbeat_interval_s=0.3, poll_timeout_ms=1000
        )
        poll_until(lambda: len(ran) == len(first), WAIT_S, "the first jobs")

        def on_shard_past_heartbeats() -> bool:
            stats = _stats(server)
            assert worker.worker_id in _workers(server)  # listed throughout
            return bool(stats["handedBack"] >= 3 and _handed_now(server) == 1)

        # Three Heartbeats took it back; it waits on the empty queue on its shard again.
        poll_until(on_shard_past_heartbeats, WAIT_S, "the worker back on its shard")
        pulled = _stats(server)["directPulled"]
        more = _fill(server, queue, [{"name": "m", "data": {"i": i}} for i in range(30)])
        poll_until(lambda: len(ran) == len(first) + len(more), WAIT_S, "the later jobs")
        assert set(ran) == {*first, *more} and set(ran.values()) == {1}  # every job once
        # Most on its shard (a Heartbeat's moment in the front end may serve one PULLB there).
        assert _stats(server)["directPulled"] - pulled >= len(more) // 2
        assert worker.worker_id in _workers(server)
        worker.close(timeout=10)
        assert worker.worker_id not in _workers(server)
    finally:
        clients.close()
