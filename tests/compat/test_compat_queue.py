"""bunqueue-client 0.1.5's `Queue` against `shardq start`: producing, queries, queue control.

Written from the client's documented API (its docstrings and README) and docs/protocol.md;
each expectation was checked against a bunqueue 2.9.5 server where they agree (the v2 job name
is where they do not: bunqueue 2.9.x strips `data.name`, shardq keeps it, which is what 0.1.5
needs, docs/protocol.md §4.6).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from bunqueue import CommandError, CommandTimeoutError, Job
from compat_clients import Clients
from shardq_harness import poll_until

pytestmark = pytest.mark.timeout(60)


def test_add_keeps_the_v2_name_in_data(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    job = queue.add("email", {"to": "a@b.c"})
    scalar = queue.add("scalar", 42)
    empty = queue.add("bare")
    got = queue.get_job(job.id)
    assert got is not None
    assert got.name == "email" and got.data == {"name": "email", "to": "a@b.c"}
    assert got.raw["name"] == "email"  # v3 readers find it on top as well
    assert got.state == "waiting" and got.queue == qname and got.max_attempts == 3
    scalar_job = queue.get_job(scalar.id)
    assert scalar_job is not None and scalar_job.data == {"name": "scalar", "payload": 42}
    empty_job = queue.get_job(empty.id)
    assert empty_job is not None and empty_job.data == {"name": "bare"}


def test_add_options_reach_the_job(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    job = queue.add(
        "opts",
        {"n": 1},
        priority=7,
        attempts=5,
        backoff={"type": "fixed", "delay": 250},
        tags=["a", "b"],
        timestamp=1_700_000_000_000,  # > int32: sent as a float (docs/protocol.md §2.2)
        lifo=True,
    )
    got = queue.get_job(job.id)
    assert got is not None
    assert (got.priority, got.max_attempts, got.tags) == (7, 5, ["a", "b"])
    assert got.created_at == 1_700_000_000_000
    assert got.state == "prioritized"
    delayed = queue.add("later", delay=60_000)
    assert queue.get_state(delayed.id) == "delayed"


def test_lookups_of_missing_things(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    assert queue.get_job("no-such-job") is None
    assert queue.get_job_by_custom_id("no-such-custom-id") is None
    assert queue.get_state("no-such-job") == "unknown"
    with pytest.raises(CommandError, match="not found"):
        queue.get_progress("no-such-job")
    with pytest.raises(CommandError, match="not found"):
        queue.add_job_log("no-such-job", "x")
    with pytest.raises(CommandError, match="not found"):
        queue.wait_for_job("no-such-job", 100)


def test_add_bulk_with_custom_ids(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    ids = queue.add_bulk(
        [
            {"name": "one", "data": {"i": 1}, "job_id": "bulk-1"},
            {"name": "two", "data": {"i": 2}},
            {"name": "three", "data": 3, "priority": 2, "job_id": "bulk-3"},
        ]
    )
    assert len(ids) == 3 and ids[0] == "bulk-1" and ids[2] == "bulk-3"
    by_custom = queue.get_job_by_custom_id("bulk-1")
    assert by_custom is not None and by_custom.id == "bulk-1" and by_custom.custom_id == "bulk-1"
    assert by_custom.name == "one" and by_custom.data == {"name": "one", "i": 1}
    third = queue.get_job(ids[2])
    assert third is not None and third.data == {"name": "three", "payload": 3}
    # A second bulk with the same custom ids returns the live jobs, inserting nothing.
    again = queue.add_bulk([{"name": "one", "job_id": "bulk-1"}, {"name": "x", "job_id": "bulk-3"}])
    assert again == ["bulk-1", "bulk-3"]
    assert queue.count() == 3
    assert queue.get_deduplication_job_id("bulk-3") == "bulk-3"


def test_custom_id_is_idempotent_under_concurrent_adds(clients: Clients, qname: str) -> None:
    threads_n, rounds = 12, 5
    queues = [clients.queue(qname) for _ in range(4)]  # several connections, shared by threads
    results: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(threads_n)

    def adder(k: int) -> None:
        queue = queues[k % len(queues)]
        try:
            start.wait(10)
            for r in range(rounds):
                if (k + r) % 2:
                    got = [queue.add("same", {"by": k}, job_id="the-one").id]
                else:
                    got = queue.add_bulk([{"name": "same", "data": {"by": k}, "job_id": "the-one"}])
                with lock:
                    results.extend(got)
        except BaseException as e:  # collected, asserted below
            errors.append(e)

    threads = [threading.Thread(target=adder, args=(k,)) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert results == ["the-one"] * (threads_n * rounds)
    counts = queues[0].get_job_counts()
    assert counts["waiting"] == 1 and sum(counts.values()) == 1


def test_counts_and_paged_get_jobs(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    ids = queue.add_bulk([{"name": f"j{i}", "data": {"i": i}} for i in range(25)])
    queue.add("p", priority=3)
    queue.add("d", delay=60_000)
    counts = queue.get_job_counts()
    assert {k: counts[k] for k in ("waiting", "prioritized", "delayed", "active")} == {
        "waiting": 25,
        "prioritized": 1,
        "delayed": 1,
        "active": 0,
    }
    assert set(counts) >= {"completed", "failed", "waiting-children", "paused"}
    assert queue.count() == 27
    assert queue.get_counts_per_priority() == {"0": 26, "3": 1}
    pages = [queue.get_waiting(start, start + 10) for start in (0, 10, 20)]
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [j.id for page in pages for j in page] == ids  # FIFO, no overlap, nothing missed
    assert all(j.state == "waiting" for page in pages for j in page)
    mixed = queue.get_jobs(["prioritized", "delayed"])
    assert sorted(str(j.state) for j in mixed) == ["delayed", "prioritized"]
    assert len(queue.get_jobs(None, 0, 5)) == 5


def test_pause_resume_drain_clean_obliterate(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    for i in range(4):
        queue.add("w", {"i": i})
    queue.add("d", delay=60_000)
    queue.pause()
    assert queue.is_paused() is True
    counts = queue.get_job_counts()
    assert counts["paused"] == 4 and counts["waiting"] == 0  # bunqueue #92
    assert queue.connection.call({"cmd": "PULL", "queue": qname})["job"] is None
    queue.resume()
    assert queue.is_paused() is False
    assert queue.drain() == 5
    assert queue.count() == 0
    # Clean removes finished jobs older than the grace period.
    job = queue.add("c", {"x": 1})
    pulled = queue.connection.call({"cmd": "PULL", "queue": qname, "owner": "o"})
    queue.move_job_to_completed(job.id, "done", token=pulled["token"])
    assert queue.get_state(job.id) == "completed"
    poll_until(lambda: queue.clean(0, state="completed") == 1, 5, "clean to remove the job")
    assert queue.get_job(job.id) is None
    queue.add("x")
    queue.obliterate()
    assert queue.get_job_counts()["waiting"] == 0 and not queue.is_paused()


def test_job_operations(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    job = queue.add("op", {"v": 1}, delay=60_000)
    queue.promote_job(job.id)
    assert queue.get_state(job.id) == "waiting"
    queue.change_job_priority(job.id, 9)
    assert queue.get_state(job.id) == "prioritized"
    queue.update_job_data(job.id, {"name": "op", "v": 2})
    got = queue.get_job(job.id)
    assert got is not None and got.data == {"name": "op", "v": 2}
    queue.change_job_delay(job.id, 60_000)
    assert queue.get_state(job.id) == "delayed"
    assert queue.promote_jobs() == 1
    other = queue.add("gone")
    queue.remove(other.id)
    assert queue.get_job(other.id) is None
    queue.discard(job.id)
    assert queue.get_state(job.id) == "failed"
    assert [j["id"] for j in queue.get_dlq()] == [job.id]
    queue.retry_job(job.id)  # failed -> waiting
    assert queue.get_state(job.id) in ("waiting", "prioritized")


def test_wait_for_job(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    job = queue.add("w", {"n": 1})
    with pytest.raises(CommandTimeoutError):
        queue.wait_for_job(job.id, 200)  # completed: false after 200 ms

    result: list[Any] = []
    waiter = threading.Thread(target=lambda: result.append(queue.wait_for_job(job.id, 10_000)))
    waiter.start()
    worker_conn = clients.queue(qname)
    pulled = worker_conn.connection.call({"cmd": "PULL", "queue": qname, "owner": "w1"})
    worker_conn.move_job_to_completed(job.id, {"answer": 42}, token=pulled["token"])
    waiter.join(15)
    assert result == [{"answer": 42}]
    assert queue.get_result(job.id) == {"answer": 42}
    assert queue.wait_for_job(job.id, 100) == {"answer": 42}


def test_job_methods_under_a_lease(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    added = queue.add("leased", {"v": 1})
    pulled = queue.connection.call({"cmd": "PULL", "queue": qname, "owner": "me", "lockTtl": 5_000})
    job = Job(pulled["job"], queue.connection, pulled["token"])
    assert job.id == added.id and job.name == "leased" and job.get_state() == "active"
    job.heartbeat()
    job.extend_lock(60_000)
    with pytest.raises(CommandError, match="Lock not found or invalid token"):
        queue.extend_job_lock(job.id, "not-the-token", 1_000)
    with pytest.raises(CommandError, match="Lock token required"):
        queue.move_job_to_delayed(job.id, 1_000)  # the Queue method sends no token
    queue.connection.call(
        {"cmd": "MoveToDelayed", "id": job.id, "delay": 60_000, "token": job.token}
    )
    assert queue.get_state(job.id) == "delayed"
    job.change_delay(0)
    assert queue.get_state(job.id) == "waiting"
    again = queue.connection.call({"cmd": "PULL", "queue": qname, "owner": "me"})
    queue.move_job_to_completed(job.id, "first", token=again["token"])
    assert queue.get_result(job.id) == "first"
    # Completed jobs can be run again.
    assert queue.retry_completed(job.id) == 1
    assert queue.get_state(job.id) == "waiting"
    third = queue.connection.call({"cmd": "PULL", "queue": qname, "owner": "me"})
    queue.move_job_to_completed(job.id, "second", token=third["token"])
    assert queue.retry_jobs("completed") == 1
    assert queue.get_state(job.id) == "waiting"


def test_dlq_and_stall_configs(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    assert queue.get_dlq_config() == {
        "autoRetry": False,
        "autoRetryInterval": 3_600_000,
        "maxAutoRetries": 3,
        "maxAge": 604_800_000,
        "maxEntries": 10_000,
    }
    queue.set_dlq_config({"maxEntries": 2, "autoRetry": False})
    assert queue.get_dlq_config()["maxEntries"] == 2
    assert queue.get_stall_config() == {
        "enabled": True,
        "stallInterval": 30_000,
        "maxStalls": 3,
        "gracePeriod": 5_000,
    }
    queue.set_stall_config({"stallInterval": 5_000, "maxStalls": 1})
    assert queue.get_stall_config() == {
        "enabled": True,
        "stallInterval": 5_000,
        "maxStalls": 1,
        "gracePeriod": 5_000,
    }
    # maxEntries bounds the DLQ: the oldest entries make room.
    ids = [queue.add("f", {"i": i}, attempts=1).id for i in range(3)]
    for job_id in ids:
        lease = queue.connection.call({"cmd": "PULL", "queue": qname, "owner": "o"})
        queue.move_job_to_failed(job_id, "broken", token=lease["token"])
    assert [j["id"] for j in queue.get_dlq()] == ids[1:]
