"""Queues that move between nodes: `forget_queues` drops them from a running engine without a
mutation, and `Engine.restore` of their records merges them back into a running engine (what
a node that gains the partition does), active jobs back to waiting with a new lock."""

from __future__ import annotations

from engine_driver import Driver

from shardq.core import Engine
from shardq.core._handover import forget_queues


def _fill(d: Driver) -> dict[str, str]:
    """Jobs of every kind in queue "gone", one waiting job in "keep"; their ids by kind."""
    ids = {"keep": d.push("keep", at=1), "custom": d.push("gone", at=1, jobId="custom-1")}
    ids["completed"] = d.run_to_completion("gone", at=2)  # custom-1
    d.push("gone", at=3)
    ids["dlq"] = d.run_to_dlq("gone", at=3)
    d.push("gone", at=4)
    ids["active"], token = d.pull_id("gone", at=4)
    ids["token"] = token or ""
    ids["waiting"] = d.push("gone", at=5)
    ids["delayed"] = d.push("gone", at=5, delay=60_000)
    d.ok({"cmd": "Cron", "name": "every-minute", "queue": "gone", "data": {},
          "repeatEvery": 60_000}, at=6)  # fmt: skip
    return ids


def test_forgetting_a_queue_drops_its_jobs_and_schedules_and_writes_nothing(
    engine: Engine, d: Driver
) -> None:
    ids = _fill(d)
    before = d.counts("keep", at=7)
    assert forget_queues(engine, {"gone"}) == 5
    assert "gone" not in engine.queues
    assert not {ids[k] for k in ("custom", "waiting", "delayed", "dlq", "active")} & set(
        engine.jobs
    )
    assert "every-minute" not in engine.cron.schedules
    # The other queue is untouched; time passing brings nothing of the dropped one back.
    assert d.counts("keep", at=7) == before
    events, mutations = d.tick(10_000_000)
    assert not [e for e in events if e[1] == "gone"], events
    assert not [m for m in mutations if "gone" in repr(m)], mutations
    assert "gone" not in engine.queues
    # A worker's lock on a dropped job is gone with it.
    error = d.err({"cmd": "ACK", "id": ids["active"], "token": ids["token"]}, at=8)
    assert "not found" in error.lower()


def test_a_forgotten_queue_restored_into_a_running_engine_comes_back_whole(
    engine: Engine, d: Driver
) -> None:
    ids = _fill(d)
    gone = engine.queues["gone"]
    records = [engine.jobs[i].to_record() for i in gone.ids]
    config = gone.config()
    forget_queues(engine, {"gone"})
    # What the database holds of it, loaded as a node that gains its partition does.
    recovered = engine.restore(records, {"gone": config}, 9)
    assert {r["id"] for r in records} <= set(engine.jobs)
    assert d.state(ids["waiting"], at=9) == "waiting"
    assert d.state(ids["delayed"], at=9) == "delayed"
    assert d.state(ids["completed"], at=9) == "completed"
    assert d.state(ids["dlq"], at=9) == "failed"
    # Active on the old owner: retried as a restart retries it (waiting, or delayed by its
    # backoff; a recovery mutation), and its old lock refused.
    assert d.state(ids["active"], at=9) in ("waiting", "delayed")
    assert recovered, "the stalled active job is written back"
    error = d.err({"cmd": "ACK", "id": ids["active"], "token": ids["token"]}, at=9)
    assert "not in processing state" in error or "lock token" in error
    # The unique custom id is claimed again: a second push of it is not a new job.
    again = d.ok({"cmd": "PUSH", "queue": "gone", "data": {}, "jobId": "custom-1"}, at=10)
    assert again["id"] == ids["custom"]
    assert d.counts("keep", at=10)["waiting"] == 1
