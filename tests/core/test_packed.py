"""Completed jobs packed into one record each (`shardq.core._packed`) answer exactly as before.

A shard packs its completed jobs when it gives memory back (`shard/_memory.py`) and as it
loads them (`Timers._load`); here, on a real engine: every read of a completed job gives the
same reply packed or not, reading one unpacks it in place (the engine's references stay
valid), a packed job can still be changed (AddLog, a retry), and a job whose fields msgpack
would not give back equal stays unpacked."""

from __future__ import annotations

from typing import Any

from shardq.core import Engine, EngineConfig
from shardq.core._job import Job
from shardq.core._packed import PackedJob, pack_completed

NOW = 1_700_000_000_000
DATA = [
    {"i": 1},
    {"nested": {"list": [1, 2.5, None, True, "é"], "big": 2**63 - 1, "neg": -(2**40)}},
    [1, [2, [3]], {"k": "v"}],
    "a string",
    None,
    {"bytes": b"\x00\xff", 7: "int key"},
]
RESULTS = [{"ok": True}, [1, 2, 3], "done", None, 3.25, {"deep": [{"x": [None]}]}]


def run(engine: Engine, cmd: dict[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = engine.apply(cmd, NOW).reply
    return reply


def completed_engine() -> tuple[Engine, list[str]]:
    engine = Engine(EngineConfig(), seed=3)
    ids = []
    for data, result in zip(DATA, RESULTS, strict=True):
        job_id = run(engine, {"cmd": "PUSH", "queue": "q", "data": data})["id"]
        pulled = run(engine, {"cmd": "PULL", "queue": "q"})["job"]
        assert pulled["id"] == job_id
        run(engine, {"cmd": "Progress", "id": job_id, "progress": 50, "message": "half"})
        run(engine, {"cmd": "AddLog", "id": job_id, "message": f"log {job_id}"})
        ack = {"cmd": "ACK", "id": job_id, "token": pulled.get("token"), "result": result}
        assert run(engine, ack)["ok"], ack
        ids.append(job_id)
    # One that failed once before it completed: a stacktrace and a longer timeline.
    job_id = run(engine, {"cmd": "PUSH", "queue": "q", "data": {"flaky": 1}})["id"]
    pulled = run(engine, {"cmd": "PULL", "queue": "q"})["job"]
    fail = {"cmd": "FAIL", "id": job_id, "token": pulled.get("token"), "error": "boom",
            "stack": ["at a", "at b"]}  # fmt: skip
    assert run(engine, fail)["ok"]
    engine.apply({"cmd": "PULL", "queue": "q"}, NOW + 10**7)  # past any backoff
    job = engine.jobs[job_id]
    assert job.state == "active", job.state
    assert run(engine, {"cmd": "ACK", "id": job_id, "token": job.token, "result": 9})["ok"]
    ids.append(job_id)
    return engine, ids


def reads(engine: Engine, ids: list[str]) -> list[dict[str, Any]]:
    out = []
    for job_id in ids:
        for cmd in ("GetJob", "GetState", "GetResult", "GetLogs"):
            out.append(run(engine, {"cmd": cmd, "id": job_id}))
    out.append(run(engine, {"cmd": "GetJobs", "queue": "q", "state": "completed", "limit": 100}))
    return out


def test_a_packed_completed_job_reads_back_identical() -> None:
    engine, ids = completed_engine()
    before = reads(engine, ids)
    objects = [engine.jobs[i] for i in ids]
    assert pack_completed(engine.jobs, engine.store.completed_order) == len(ids)
    assert all(type(engine.jobs[i]) is PackedJob for i in ids)
    assert reads(engine, ids) == before
    # Reading unpacked them in place: the same objects, plain jobs again.
    assert [engine.jobs[i] for i in ids] == objects
    assert all(type(engine.jobs[i]) is Job for i in ids)
    # Packed again: still the same.
    assert pack_completed(engine.jobs, engine.store.completed_order) == len(ids)
    assert reads(engine, ids) == before


def test_a_packed_job_can_still_change() -> None:
    engine, ids = completed_engine()
    pack_completed(engine.jobs, engine.store.completed_order)
    first = ids[0]
    assert run(engine, {"cmd": "AddLog", "id": first, "message": "after"})["ok"]
    logs = run(engine, {"cmd": "GetLogs", "id": first})
    assert [entry["message"] for entry in logs["data"]["logs"]][-1] == "after"
    pack_completed(engine.jobs, engine.store.completed_order)
    retried = run(engine, {"cmd": "RetryCompleted", "queue": "q", "id": first})
    assert retried["ok"], retried
    again = run(engine, {"cmd": "PULL", "queue": "q"})["job"]
    assert again["id"] == first and again["data"] == DATA[0]


def test_a_job_with_a_long_record_stays_unpacked() -> None:
    engine = Engine(EngineConfig(), seed=5)
    job_id = run(engine, {"cmd": "PUSH", "queue": "q", "data": {"text": "x" * 600}})["id"]
    pulled = run(engine, {"cmd": "PULL", "queue": "q"})["job"]
    run(engine, {"cmd": "ACK", "id": job_id, "token": pulled.get("token")})
    assert pack_completed(engine.jobs, engine.store.completed_order) == 0
    assert type(engine.jobs[job_id]) is Job


def test_fields_msgpack_would_change_stay_unpacked() -> None:
    engine = Engine(EngineConfig(), seed=4)
    job_id = run(engine, {"cmd": "PUSH", "queue": "q", "data": {"t": (1, 2)}})["id"]
    pulled = run(engine, {"cmd": "PULL", "queue": "q"})["job"]
    run(engine, {"cmd": "ACK", "id": job_id, "token": pulled.get("token"), "result": 2**70})
    before = run(engine, {"cmd": "GetJob", "id": job_id})
    assert pack_completed(engine.jobs, engine.store.completed_order) == 0
    assert type(engine.jobs[job_id]) is Job
    assert run(engine, {"cmd": "GetJob", "id": job_id}) == before


def restored(engine: Engine, config: EngineConfig) -> Engine:
    """A fresh engine that loaded `engine`'s jobs from their records, as a restart does."""
    records = [job.to_record() for job in engine.jobs.values()]
    fresh = Engine(config, seed=3)
    fresh.restore(records, {}, NOW)
    return fresh


def test_completed_jobs_are_packed_as_they_are_loaded() -> None:
    # A restart packs each completed job as it loads it (`Timers._load`), so the load's
    # transient objects are freed before the next record's: every answer stays the same.
    engine, ids = completed_engine()
    before = reads(engine, ids)
    fresh = restored(engine, EngineConfig())
    assert all(type(fresh.jobs[i]) is PackedJob for i in ids)
    assert reads(fresh, ids) == before


def test_results_evicted_at_the_load_leave_the_jobs_packed() -> None:
    # Past `max_results` the oldest results are forgotten (`retain_completed`); a packed job
    # loses its result and stays packed instead of being decoded for good.
    engine, ids = completed_engine()
    fresh = restored(engine, EngineConfig(max_results=2))
    assert all(type(fresh.jobs[i]) is PackedJob for i in ids)
    results = [run(fresh, {"cmd": "GetResult", "id": i}) for i in ids]
    kept = [run(engine, {"cmd": "GetResult", "id": i}) for i in ids[-2:]]
    assert results[-2:] == kept
    for job_id, reply in zip(ids[:-2], results[:-2], strict=True):
        assert fresh.jobs[job_id].has_result is False
        assert reply.get("result") is None, reply


def test_times_apart_come_back_exact() -> None:
    # `run_at`, `started_at`, `last_heartbeat` and the timeline's times are packed as offsets
    # from one base: a delayed job, pulled late, failed once and completed later still, with
    # every time different (and one before the base), reads back the same, packed and reloaded.
    engine = Engine(EngineConfig(), seed=6)
    push = {"cmd": "PUSH", "queue": "q", "data": {"d": 1}, "delay": 5_000, "timestamp": NOW - 77}
    job_id = run(engine, push)["id"]
    engine.apply({"cmd": "PULL", "queue": "q"}, NOW + 4_000)
    pulled = engine.apply({"cmd": "PULL", "queue": "q"}, NOW + 6_123).reply["job"]
    fail = {"cmd": "FAIL", "id": job_id, "token": pulled.get("token"), "error": "x"}
    engine.apply(fail, NOW + 7_000)
    again = engine.apply({"cmd": "PULL", "queue": "q"}, NOW + 10**7).reply["job"]
    beat = {"cmd": "JobHeartbeat", "id": job_id, "token": again.get("token")}
    engine.apply(beat, NOW + 10**7 + 41)
    ack = {"cmd": "ACK", "id": job_id, "token": again.get("token"), "result": [1]}
    assert engine.apply(ack, NOW + 10**7 + 999).reply["ok"]
    job = engine.jobs[job_id]
    times = (job.created_at, job.run_at, job.started_at, job.last_heartbeat, job.completed_at)
    assert len(set(times)) == 5, times
    assert len({entry[1] for entry in job.timeline}) >= 4, job.timeline
    before = reads(engine, [job_id])
    assert pack_completed(engine.jobs, [job_id]) == 1
    assert reads(engine, [job_id]) == before
    fresh = restored(engine, EngineConfig())
    assert type(fresh.jobs[job_id]) is PackedJob
    assert reads(fresh, [job_id]) == before
    assert (fresh.jobs[job_id].run_at, fresh.jobs[job_id].last_heartbeat) == times[1:4:2]
