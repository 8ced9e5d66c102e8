"""Queue operations against the real server, for each transport and client kind."""

from __future__ import annotations

import pytest
from client_helpers import Clients, queue_name, wait_until

from shardq.client import (
    DeadLettered,
    JobFailed,
    JobOptions,
    NotFound,
    ServerError,
    UnrecoverableError,
    WaitTimeout,
)


def test_add_get_job_and_counts(clients: Clients) -> None:
    queue = clients.queue()
    job_id = queue.add("welcome", {"to": "a@b.c"}, JobOptions(priority=5, max_attempts=4))

    job = queue.get_job(job_id)
    assert job is not None
    assert (job.id, job.name, job.data, job.queue) == (
        job_id,
        "welcome",
        {"to": "a@b.c"},
        queue.name,
    )
    assert (job.state, job.priority, job.max_attempts, job.attempts) == ("prioritized", 5, 4, 0)
    assert queue.get_state(job_id) == "prioritized"
    assert queue.get_job("no-such-job") is None
    assert queue.get_state("no-such-job") == "unknown"

    counts = queue.counts()
    assert (counts.prioritized, counts.waiting, counts.unfinished) == (1, 0, 1)


def test_custom_job_id_is_idempotent(clients: Clients) -> None:
    queue = clients.queue()
    custom = f"order-{queue.name}"  # job ids are global: unique per test
    first = queue.add("a", 1, JobOptions(job_id=custom))
    again = queue.add("a", 2, {"jobId": custom})  # raw wire options work too
    assert first == again == custom
    assert queue.counts().waiting == 1


def test_bullmq_option_names_are_honoured_and_unknown_ones_refused(clients: Clients) -> None:
    # The same options the CLI and the REST routes take, from the one command schema.
    queue = clients.queue()
    job_id = queue.add("a", 1, {"attempts": 5, "delay": -10, "jobId": f"bull-{queue.name}"})
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.id, job.max_attempts, job.state) == (f"bull-{queue.name}", 5, "waiting")
    with pytest.raises(ServerError, match=r"^Unknown option: atempts$"):
        queue.add("a", 1, {"atempts": 3})


def test_add_bulk_chunks_and_keeps_order(clients: Clients) -> None:
    queue = clients.queue()
    jobs = [("bulk", {"i": i}) for i in range(2_345)]
    ids = queue.add_bulk(jobs)  # 3 PUSHBs of up to 1000
    assert len(ids) == len(set(ids)) == 2_345
    assert queue.counts().waiting == 2_345
    assert queue.get_job(ids[1_500]).data == {"i": 1_500}

    wanted = [f"{queue.name}-{i}" for i in range(25)]
    custom = queue.add_bulk(
        [("c", i, JobOptions(job_id=j)) for i, j in enumerate(wanted)], chunk_size=10
    )
    assert custom == wanted
    with pytest.raises(ValueError):
        queue.add_bulk(jobs, chunk_size=1001)


def test_pause_and_resume(clients: Clients) -> None:
    queue = clients.queue()
    queue.pause()
    assert queue.is_paused()
    queue.add("held", None)
    seen: list[str] = []
    worker = clients.worker(queue.name, lambda job: seen.append(job.id)).start()

    # The worker polls a paused queue and gets nothing: the job stays put.
    wait_until(lambda: queue.counts().paused == 1, what="the job counted as paused")
    assert seen == [] and queue.counts().active == 0

    queue.resume()
    assert not queue.is_paused()
    counts = queue.join(timeout=10)
    assert counts.completed == 1 and len(seen) == 1
    worker.close()


def test_drain_clean_obliterate(clients: Clients) -> None:
    queue = clients.queue()
    queue.add_bulk([("w", i) for i in range(5)])
    queue.add("later", None, JobOptions(delay_ms=600_000))
    assert queue.counts().delayed == 1
    assert queue.drain() == 6
    assert queue.counts().unfinished == 0

    queue.add_bulk([("w", i) for i in range(3)])
    stats = clients.worker(queue.name, lambda job: job.data * 2).run_until_idle(timeout=10)
    assert stats.processed == 3
    assert queue.counts().completed == 3
    cleaned = queue.clean(grace_ms=0, state="completed")
    assert len(cleaned) == 3 and queue.counts().completed == 0
    with pytest.raises(ValueError):
        queue.clean(state="bogus")

    kept = queue.add("x", None)
    queue.obliterate()
    assert queue.get_job(kept) is None
    assert queue.counts().unfinished == 0


def test_dlq_list_retry_purge(clients: Clients) -> None:
    queue = clients.queue()
    ids = queue.add_bulk([("bad", i, JobOptions(max_attempts=1)) for i in range(3)])

    def fail(job: object) -> None:
        raise RuntimeError("nope")

    stats = clients.worker(queue.name, fail).run_until_idle(timeout=10)
    assert stats.failed == 3
    entries = queue.dlq()
    assert sorted(e.job.id for e in entries) == sorted(ids)
    assert {(e.reason, e.error) for e in entries} == {("max_attempts_exceeded", "nope")}
    assert len(queue.dlq(count=2)) == 2

    assert queue.retry_dlq(job_id=ids[0]) == 1
    assert queue.get_state(ids[0]) == "waiting"
    clients.worker(queue.name, lambda job: "fixed").run_until_idle(timeout=10)
    assert queue.get_job(ids[0]).result == "fixed"

    assert queue.purge_dlq() == 2
    assert queue.dlq() == [] and queue.counts().failed == 0


def test_wait_for_and_wait_until_finished(clients: Clients) -> None:
    queue = clients.queue()
    ids = queue.add_bulk([("sq", i) for i in range(20)])
    worker = clients.worker(queue.name, lambda job: job.data**2, concurrency=4).start()
    assert queue.wait_for(ids[7], timeout=10) == 49
    counts = queue.wait_until_finished(timeout=10)
    assert counts.completed == 20 and counts.unfinished == 0
    worker.close()
    with pytest.raises(NotFound):
        queue.wait_for("no-such-job", timeout=1)


def test_join_fails_on_dead_letter_and_times_out(clients: Clients) -> None:
    queue = clients.queue()
    doomed = queue.add("doomed", None)

    def handler(job: object) -> None:
        raise UnrecoverableError("bad input")

    worker = clients.worker(queue.name, handler).start()
    with pytest.raises(DeadLettered) as info:
        queue.join(timeout=10)
    assert info.value.jobs == [(doomed, "bad input")]
    with pytest.raises(JobFailed, match="bad input"):
        queue.wait_for(doomed, timeout=5)
    worker.close()

    paused = clients.queue(queue_name())
    paused.pause()
    paused.add("stuck", None)
    with pytest.raises(WaitTimeout):
        paused.wait_until_finished(timeout=0.3)
