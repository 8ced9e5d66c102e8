"""The completed window loaded the short way (`_packed.from_record`) is the window the long
way loads (`Job.from_record`, then `pack_job`): the same jobs, packed or not alike, field for
field, and every read, count, custom-id dedup and retention step answers the same.

Both engines load the same history's records, decoded from msgpack as the storage hands them
back. The long way is taken by a record whose timeline entries are maps (a form
`Job.from_record` reads and the short way leaves to it), so one copy of the records goes
through each path of the real restore; the test checks that each copy took its path."""

from __future__ import annotations

import random
from typing import Any

import msgpack  # type: ignore[import-untyped]

from shardq.core import Engine, EngineConfig
from shardq.core._job import Job
from shardq.core._packed import PackedJob, from_record

NOW = 1_700_000_000_000
QUEUES = ("a", "b")
VALUES: list[Any] = [
    {"i": 1},
    {"nested": {"list": [1, 2.5, None, True, "é"], "big": 2**63 - 1, "neg": -(2**40)}},
    [1, [2, [3]], {"k": "v"}],
    "text",
    None,
    {"bytes": b"\x00\xff", 7: "int key"},
    {"long": "x" * 600},  # past the packed record's bound: stays unpacked
    3.25,
    2**64 - 1,
]
CONFIG = EngineConfig(max_completed=60, max_results=40)


def run(engine: Engine, cmd: dict[str, Any], now: int) -> dict[str, Any]:
    reply: dict[str, Any] = engine.apply(cmd, now).reply
    return reply


def history(seed: int) -> tuple[Engine, int]:
    """An engine after a random history: jobs completed with payloads and results of every
    kind, some after a failure (a stacktrace), with logs, progress, custom ids, delays;
    others left waiting, delayed, active or failed."""
    rng = random.Random(seed)
    engine = Engine(EngineConfig(max_completed=1000), seed=seed)
    now = NOW
    for n in range(160):
        now += rng.choice((0, 1, 7, 1_000))
        queue = rng.choice(QUEUES)
        push: dict[str, Any] = {"cmd": "PUSH", "queue": queue, "data": rng.choice(VALUES)}
        if rng.random() < 0.3:
            push["jobId"] = f"custom-{n % 23}"
        if rng.random() < 0.2:
            push["delay"] = rng.choice((5, 2_000))
        if rng.random() < 0.2:
            push["priority"] = rng.randint(1, 5)
        if not run(engine, push, now).get("ok"):
            continue
        if rng.random() < 0.15:
            continue  # left waiting or delayed
        now += rng.choice((1, 3_000))
        pulled = run(engine, {"cmd": "PULL", "queue": queue, "owner": "w"}, now)
        job = pulled.get("job")
        if not job:
            continue
        job_id, token = job["id"], pulled.get("token")
        if rng.random() < 0.3:
            run(engine, {"cmd": "AddLog", "id": job_id, "message": f"log {n}"}, now)
        if rng.random() < 0.3:
            run(engine, {"cmd": "Progress", "id": job_id, "progress": 40}, now)
        if rng.random() < 0.2:
            fail = {"cmd": "FAIL", "id": job_id, "token": token, "error": "boom",
                    "stack": ["at a", "at b"]}  # fmt: skip
            run(engine, fail, now)
            now += 10**7  # past any backoff
            pulled = run(engine, {"cmd": "PULL", "queue": queue, "owner": "w"}, now)
            if not pulled.get("job") or pulled["job"]["id"] != job_id:
                continue
            token = pulled.get("token")
        if rng.random() < 0.1:
            continue  # left active
        ack = {"cmd": "ACK", "id": job_id, "token": token, "result": rng.choice(VALUES)}
        run(engine, ack, now + rng.choice((0, 2, 500)))
    return engine, now + 1_000


def stored(engine: Engine) -> list[dict[str, Any]]:
    """The jobs' records as the storage gives them back (msgpack, in seq order)."""
    records = [job.to_record() for job in sorted(engine.jobs.values(), key=lambda j: j.seq)]
    return [
        msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False, strict_map_key=False)
        for r in records
    ]


def long_way(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same records with map timeline entries, which only `Job.from_record` reads."""
    out = []
    for rec in records:
        entries = [{"state": s, "timestamp": t, "attempt": a} for s, t, a in rec["timeline"]]
        out.append({**rec, "timeline": entries})
    return out


def restored(records: list[dict[str, Any]], now: int) -> Engine:
    engine = Engine(CONFIG, seed=9)
    engine.restore(records, {}, now)
    return engine


def slots(job: Job) -> dict[str, Any]:
    """Every slot as stored (a packed job's blob, not its decoded fields)."""
    return {name: Job.__dict__[name].__get__(job, Job) for name in Job.__slots__}


def reads(engine: Engine, ids: list[str], now: int) -> list[Any]:
    out: list[Any] = []
    for job_id in ids:
        for cmd in ("GetJob", "GetState", "GetResult", "GetLogs"):
            out.append(run(engine, {"cmd": cmd, "id": job_id}, now))
    for queue in QUEUES:
        out.append(run(engine, {"cmd": "GetJobCounts", "queue": queue}, now))
        for state in ("completed", "waiting", "delayed", "active", "failed"):
            cmd = {"cmd": "GetJobs", "queue": queue, "state": state, "limit": 1000}
            out.append(run(engine, cmd, now))
    return out


def test_the_short_way_loads_the_window_the_long_way_does() -> None:
    for seed in range(6):
        source, now = history(seed)
        records = stored(source)
        completed = [r for r in records if r["state"] == "completed"]
        assert len(completed) > CONFIG.max_completed, seed  # retention trims at the load
        # Each copy of the records takes its own path.
        assert all(from_record(r)[1] is None for r in long_way(completed))
        short = [r for r in completed if from_record(r)[1] is not None]
        assert len(short) >= len(completed) // 2, seed
        new, old = restored(records, now), restored(long_way(records), now)
        assert list(new.jobs) == list(old.jobs)
        assert list(new.store.completed_order) == list(old.store.completed_order)
        for job_id, job in new.jobs.items():
            assert type(job) is type(old.jobs[job_id]), job_id
            assert slots(job) == slots(old.jobs[job_id]), job_id
        assert any(type(job) is PackedJob for job in new.jobs.values())
        ids = sorted(source.jobs)
        assert reads(new, ids, now) == reads(old, ids, now)
        # Custom ids still deduplicate alike, and the window trims the same jobs.
        for n in range(23):
            push = {"cmd": "PUSH", "queue": "a", "data": n, "jobId": f"custom-{n}"}
            assert run(new, push, now) == run(old, push, now)
        for engine in (new, old):
            for _ in range(30):
                pulled = run(engine, {"cmd": "PULL", "queue": "a", "owner": "w"}, now)
                if not pulled.get("job"):
                    break
                ack = {"cmd": "ACK", "id": pulled["job"]["id"], "token": pulled.get("token")}
                run(engine, ack, now)
        assert list(new.store.completed_order) == list(old.store.completed_order)
        assert sorted(new.jobs) == sorted(old.jobs)
        assert reads(new, ids, now) == reads(old, ids, now)
