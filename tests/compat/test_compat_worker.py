"""bunqueue-client 0.1.5's `Worker` against `shardq start`: the whole worker loop.

RegisterWorker, PULLB with owner/lockTtl/timeout, ACK/ACKB/FAIL, JobHeartbeatB and the worker
Heartbeat, UnregisterWorker and ListWorkers, as the client sends them.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
from bunqueue import Bunqueue, Job, UnrecoverableError
from compat_clients import Clients
from shardq_harness import poll_until
from wire_clients import Tcp

pytestmark = pytest.mark.timeout(60)


def wait_states(clients: Clients, qname: str, ids: list[str], state: str, timeout: float) -> None:
    queue = clients.queue(qname)
    poll_until(
        lambda: all(queue.get_state(i) == state for i in ids),
        timeout,
        f"{len(ids)} jobs to be {state}",
        detail=lambda: str(queue.get_job_counts()),
    )


def test_worker_with_concurrency_runs_jobs_in_parallel(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    running = 0
    peak = 0
    lock = threading.Lock()
    all_in = threading.Event()

    def process(job: Job) -> Any:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            if running == 4:
                all_in.set()
        all_in.wait(10)  # the first four only finish once all four run at once
        time.sleep(0.01)
        with lock:
            running -= 1
        return {"double": job.data["n"] * 2}

    ids = queue.add_bulk([{"name": "calc", "data": {"n": n}} for n in range(16)])
    completed: list[str] = []
    worker = clients.worker(qname, process, concurrency=4, batch_size=4)
    worker.on("completed", lambda job, result: completed.append(job.id))
    wait_states(clients, qname, ids, "completed", 20)
    assert peak == 4
    assert [queue.get_result(i) for i in ids] == [{"double": n * 2} for n in range(16)]
    poll_until(lambda: len(completed) == 16, 5, "16 completed events")


def test_retries_with_backoff_then_success(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    seen: list[tuple[int, float]] = []

    def process(job: Job) -> str:
        seen.append((job.attempts, time.monotonic()))
        if job.attempts < 2:
            raise RuntimeError(f"flaky {job.attempts}")
        return "finally"

    job = queue.add("flaky", {"x": 1}, attempts=3, backoff={"type": "fixed", "delay": 300})
    clients.worker(qname, process, concurrency=2)
    assert queue.wait_for_job(job.id, 15_000) == "finally"
    assert [a for a, _ in seen] == [0, 1, 2]
    # Fixed backoff: 300 ms +-20 % between attempts.
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(seen)]
    assert all(0.2 <= gap < 2.0 for gap in gaps), gaps
    done = queue.get_job(job.id)
    assert done is not None and done.attempts == 2 and done.state == "completed"


def test_exhausted_retries_and_unrecoverable_go_to_the_dlq(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    calls: dict[str, int] = {}

    def process(job: Job) -> None:
        calls[job.name or ""] = calls.get(job.name or "", 0) + 1
        if job.name == "fatal":
            raise UnrecoverableError("do not retry me")
        raise ValueError("always fails")

    fatal = queue.add("fatal", {"k": 1}, attempts=5)
    doomed = queue.add("doomed", {"k": 2}, attempts=2, backoff=10)
    failed: list[str] = []
    worker = clients.worker(qname, process, concurrency=2)
    worker.on("failed", lambda job, exc: failed.append(job.id))
    wait_states(clients, qname, [fatal.id, doomed.id], "failed", 15)
    assert calls == {"fatal": 1, "doomed": 2}
    dlq = {j["id"]: j for j in queue.get_dlq()}
    assert set(dlq) == {fatal.id, doomed.id}
    fatal_job = queue.get_job(fatal.id)
    assert fatal_job is not None and fatal_job.attempts == 1
    assert fatal_job.raw["failedReason"] == "do not retry me"
    assert fatal_job.stacktrace and "UnrecoverableError" in fatal_job.stacktrace[-1]
    assert queue.get_job_counts()["failed"] == 2
    with pytest.raises(Exception, match="failed before completion"):
        queue.wait_for_job(doomed.id, 1000)


def test_dlq_retry_and_purge(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    ids = [queue.add("bad", {"i": i}, attempts=1).id for i in range(3)]
    worker_calls = 0
    fail = True

    def process(job: Job) -> str:
        nonlocal worker_calls
        worker_calls += 1
        if fail:
            raise RuntimeError("nope")
        return "ok"

    worker = clients.worker(qname, process, concurrency=3)
    wait_states(clients, qname, ids, "failed", 15)
    assert len(queue.get_dlq()) == 3 and len(queue.get_dlq(count=2)) == 2
    fail = False
    assert queue.retry_dlq(job_id=ids[0]) == 1
    assert queue.wait_for_job(ids[0], 10_000) == "ok"
    worker.close(timeout=10)
    assert queue.purge_dlq() == 2
    assert queue.get_dlq() == [] and queue.get_job_counts()["failed"] == 0
    assert worker_calls == 4


def test_progress_and_logs_from_the_processor(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    mid: dict[str, Any] = {}
    release = threading.Event()
    progress_events: list[Any] = []

    def process(job: Job) -> str:
        job.update_progress(40, "fetching")
        job.log("step one")
        job.log("careful", level="warn")
        mid["progress"] = queue.get_progress(job.id)
        release.wait(10)
        job.update_progress(100)
        return "done"

    job = queue.add("p", {"x": 1})
    worker = clients.worker(qname, process)
    worker.on("progress", lambda j, p: progress_events.append(p))
    poll_until(lambda: "progress" in mid, 10, "the processor to report progress")
    assert mid["progress"] == {"progress": 40, "message": "fetching"}
    assert queue.get_state(job.id) == "active"
    release.set()
    assert queue.wait_for_job(job.id, 10_000) == "done"
    logs = queue.get_job_logs(job.id)
    assert [(line["level"], line["message"]) for line in logs] == [
        ("info", "step one"),
        ("warn", "careful"),
    ]
    assert len(queue.get_job_logs(job.id, 1, 1)) == 1
    queue.clear_job_logs(job.id)
    assert queue.get_job_logs(job.id) == []
    assert progress_events == [40, 100]
    done = queue.get_job(job.id)
    assert done is not None and done.progress == 100


def test_heartbeats_keep_a_job_longer_than_its_lock(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    # Without heartbeats a lease really does lapse: the job is taken back, an attempt charged.
    queue.add("unattended")
    pulled = queue.connection.call(
        {"cmd": "PULL", "queue": qname, "owner": "silent", "lockTtl": 300}
    )
    lapsed = pulled["job"]["id"]
    poll_until(lambda: queue.get_state(lapsed) == "waiting", 10, "the lapsed lease to requeue")
    requeued = queue.get_job(lapsed)
    assert requeued is not None and requeued.attempts == 1
    queue.remove(lapsed)

    runs: list[str] = []
    errors: list[BaseException] = []

    def slow(job: Job) -> str:
        runs.append(job.id)
        time.sleep(2.5)  # > 2 lock TTLs
        return "survived"

    job = queue.add("slow", {"x": 1})
    worker = clients.worker(qname, slow, concurrency=2, lock_ttl_ms=1000, heartbeat_interval_s=0.2)
    worker.on("error", errors.append)
    assert queue.wait_for_job(job.id, 15_000) == "survived"
    assert runs == [job.id] and not errors
    done = queue.get_job(job.id)
    assert done is not None and done.attempts == 0


def test_ack_batching(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    sent: list[str] = []
    ids = queue.add_bulk([{"name": "b", "data": {"i": i}} for i in range(60)])
    clients.worker(
        qname,
        lambda job: job.data["i"],
        concurrency=8,
        batch_size=20,
        ack_batch={"max_size": 10, "max_delay_ms": 20},
        on_telemetry=lambda event: sent.append(event.get("cmd", "")),
    )
    wait_states(clients, qname, ids, "completed", 20)
    assert [queue.get_result(i) for i in ids] == list(range(60))
    assert "ACKB" in sent and "ACK" not in sent
    assert sent.count("ACKB") < 60


# What the registry's waits allow: a heartbeat every 0.2 s, a closed connection seen at once
# on a quiet machine; 5 s was too short when parallel CI jobs loaded the 2 cores (the server's
# processes and the client's threads all wait their turn), and a registry that never updates
# still fails after this long.
BUSY_S = 20


def test_worker_registry(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)

    def mine() -> list[dict[str, Any]]:
        return [w for w in queue.get_workers() if qname in w["queues"]]

    worker = clients.worker(qname, lambda job: None, concurrency=3, heartbeat_interval_s=0.2)
    # bunqueue-client's worker is ready once its RegisterWorker was answered, or failed (a
    # timeout under a loaded CI machine), in which case it registers again on its next poll.
    poll_until(lambda: len(mine()) == 1, BUSY_S, "the worker's registration")
    (entry,) = mine()
    assert entry["id"] == worker.worker_id and entry["name"] == worker.name
    assert entry["concurrency"] == 3 and entry["status"] == "active"
    # An epoch-ms time comes as a float on the TCP port, as bunqueue sends it (protocol §21.5).
    assert isinstance(entry["registeredAt"], float) and entry["uptime"] >= 0
    job = queue.add("one")
    queue.wait_for_job(job.id, 10_000)
    # The worker's Heartbeat reports its counters.
    poll_until(lambda: mine()[0]["processedJobs"] == 1, BUSY_S, "a heartbeat with processed=1")
    # RegisterWorker is an upsert: registering the same id again keeps one entry. (A raw
    # socket here: bunqueue-client's close() does not always send FIN at once, as its reader
    # thread still sits in recv() on the socket.)
    other = Tcp(clients.server.tcp_address)
    try:
        again = other.call(
            {
                "cmd": "RegisterWorker",
                "name": "ignored",
                "queues": [qname, "more"],
                "concurrency": 5,
                "workerId": worker.worker_id,
                "startedAt": float(time.time() * 1000),
            }
        )
        assert again["data"]["name"] == worker.name and again["data"]["concurrency"] == 5
        assert len(mine()) == 1 and mine()[0]["queues"] == [qname, "more"]
        assert other.call({"cmd": "Heartbeat", "id": "nobody"}) == {
            "ok": False,
            "error": "Worker not found",
        }
        other.call({"cmd": "RegisterWorker", "name": "raw", "queues": [qname], "workerId": "raw"})
        assert {w["id"] for w in mine()} == {worker.worker_id, "raw"}
        stats = other.call({"cmd": "ListWorkers"})["data"]["stats"]
        assert stats["total"] >= 2 and stats["concurrencySlots"] >= 6
    finally:
        other.close()
    # A closed connection takes the workers it registered with it (not the one it re-registered:
    # that one stays with the connection that registered it first); Worker.close unregisters.
    poll_until(lambda: {w["id"] for w in mine()} == {worker.worker_id}, BUSY_S, "'raw' to go")
    assert worker.close(timeout=10)
    assert mine() == []
    with pytest.raises(Exception, match="Worker not found"):
        queue.connection.call({"cmd": "UnregisterWorker", "workerId": worker.worker_id})


def test_raw_pull_and_pullb_leases(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    call = queue.connection.call
    ids = queue.add_bulk([{"name": "r", "data": {"i": i}} for i in range(3)])
    empty = call({"cmd": "PULL", "queue": qname + "-empty", "owner": "o", "timeout": 250})
    assert empty["job"] is None and empty["token"] is None
    batch = call({"cmd": "PULLB", "queue": qname, "count": 2, "owner": "o", "lockTtl": 30_000})
    assert [j["id"] for j in batch["jobs"]] == ids[:2] and len(batch["tokens"]) == 2
    first, second = batch["jobs"]
    with pytest.raises(Exception, match="Lock token required"):
        call({"cmd": "ACK", "id": first["id"]})
    with pytest.raises(Exception, match="Invalid or expired lock token"):
        call({"cmd": "ACK", "id": first["id"], "token": batch["tokens"][1]})
    hb = call({"cmd": "JobHeartbeatB", "ids": [first["id"], "missing"], "tokens": batch["tokens"]})
    assert hb["data"] == {"ok": True, "count": 1}
    call({"cmd": "ACKB", "ids": [first["id"], second["id"]], "tokens": batch["tokens"]})
    assert queue.get_state(first["id"]) == queue.get_state(second["id"]) == "completed"
    single = call({"cmd": "PULL", "queue": qname})  # no owner: no lock, no token
    assert single["job"]["id"] == ids[2] and "token" not in single
    call({"cmd": "ACK", "id": ids[2], "result": [1, 2]})
    assert queue.get_result(ids[2]) == [1, 2]


def test_simple_mode_routes_by_the_v2_name(clients: Clients, qname: str) -> None:
    # Simple Mode routes on `job.name`, which 0.1.5 reads from `data.name`: the feature a
    # bunqueue 2.9.x server breaks for this client by moving the name out of `data`.
    host, port = clients.server.tcp_address
    app = Bunqueue(
        qname,
        host=host,
        port=port,
        poll_timeout_ms=300,
        routes={
            "greet": lambda job: f"hello {job.data['who']}",
            "add": lambda job: job.data["a"] + job.data["b"],
        },
    )
    try:
        greet = app.add("greet", {"who": "shardq"})
        add = app.add("add", {"a": 2, "b": 3})
        assert app.queue.wait_for_job(greet.id, 10_000) == "hello shardq"
        assert app.queue.wait_for_job(add.id, 10_000) == 5
    finally:
        app.close()
