"""The mutation stream alone rebuilds the engine: replaying it into an empty engine gives the
same jobs, in the same states, in the same queue order."""

from __future__ import annotations

import os
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.core import Engine, EngineConfig, Mutation, fold_mutations

QUEUES = ("alpha", "beta", "gamma")
# lastHeartbeat is refreshed in memory by heartbeats and never persisted on its own.
NOT_PERSISTED = {"lastHeartbeat"}


def _owned(engine: Engine, key: tuple[Any, ...], slot: str) -> bool:
    job = engine.jobs.get(key[-1])
    return job is not None and getattr(job, slot) is key


def snapshot(engine: Engine) -> dict[str, Any]:
    """Everything observable about the queues: order, states and records."""
    out: dict[str, Any] = {}
    for name, q in sorted(engine.queues.items()):
        if q.is_default():
            continue  # an empty queue with default controls leaves no trace, by design
        ready = [k[-1] for k in sorted(q.ready) if _owned(engine, k, "hkey")]
        delayed = [
            k[-1]
            for k in sorted(engine.store.delayed)
            if k[-1] in q.ids and _owned(engine, k, "dkey")
        ]
        records = {}
        for job_id in sorted(q.ids):
            rec = engine.jobs[job_id].to_record()
            records[job_id] = {k: v for k, v in rec.items() if k not in NOT_PERSISTED}
        out[name] = {
            "ready": ready,
            "delayed": delayed,
            "dlq": list(q.dlq),
            "config": q.config(),
            "counts": dict(q.counts),
            "records": records,
        }
    return out


class Driver:
    """A random but reproducible workload that touches every mutating path."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.engine = Engine(EngineConfig(max_completed=100_000), seed=seed)
        self.now = 5_000_000
        self.mutations: list[Mutation] = []
        self.held: list[tuple[str, str]] = []

    def do(self, cmd: dict[str, Any]) -> dict[str, Any]:
        reply, muts = (outcome := self.engine.apply(cmd, self.now)).reply, outcome.mutations
        self.mutations.extend(muts)
        return reply

    def step(self) -> None:
        r = self.rng
        action = r.choice(self.ACTIONS)
        action(self, r)

    def push(self, r: random.Random) -> None:
        cmd: dict[str, Any] = {
            "cmd": "PUSH",
            "queue": r.choice(QUEUES),
            "data": {"v": r.randrange(1000)},
            "priority": r.choice((0, 0, 1, 7)),
            "delay": r.choice((0, 0, 2_000)),
            "lifo": r.random() < 0.2,
            "maxAttempts": r.randint(1, 3),
        }
        if r.random() < 0.2:
            cmd["jobId"] = f"c{r.randrange(5)}"
        self.do(cmd)

    def push_bulk(self, r: random.Random) -> None:
        jobs = [{"data": i, "priority": r.choice((0, 3))} for i in range(r.randint(1, 6))]
        self.do({"cmd": "PUSHB", "queue": r.choice(QUEUES), "jobs": jobs})

    def pull(self, r: random.Random) -> None:
        reply = self.do({"cmd": "PULLB", "queue": r.choice(QUEUES), "owner": "w", "count": 3})
        self.held.extend(zip((j["id"] for j in reply["jobs"]), reply["tokens"], strict=True))

    def finish(self, r: random.Random) -> None:
        if not self.held:
            return
        job_id, token = self.held.pop(r.randrange(len(self.held)))
        if r.random() < 0.6:
            self.do({"cmd": "ACK", "id": job_id, "token": token, "result": r.random()})
        else:
            self.do({"cmd": "FAIL", "id": job_id, "token": token, "error": "x"})

    def control(self, r: random.Random) -> None:
        queue = r.choice(QUEUES)
        some = r.choice(list(self.engine.jobs) or ["none"])
        cmd = r.choice(
            (
                {"cmd": "Pause", "queue": queue},
                {"cmd": "Resume", "queue": queue},
                {"cmd": "Cancel", "id": some},
                {"cmd": "Promote", "id": some},
                {"cmd": "ChangePriority", "id": some, "priority": r.randint(0, 9)},
                {"cmd": "ChangeDelay", "id": some, "delay": r.choice((0, 3_000))},
                {"cmd": "Update", "id": some, "data": {"new": True}},
                {"cmd": "RetryDlq", "queue": queue},
                {"cmd": "AddLog", "id": some, "message": "hello"},
                {"cmd": "SetStallConfig", "queue": queue, "config": {"maxStalls": 2}},
                {"cmd": "Drain", "queue": queue},
                {"cmd": "Clean", "queue": queue, "grace": 0, "state": "completed"},
            )
        )
        if r.random() < 0.02:
            cmd = {"cmd": "Obliterate", "queue": queue}
        self.do(cmd)

    def tick(self, r: random.Random) -> None:
        self.now += r.choice((1, 1_000, 31_000))
        _, muts = self.engine.tick(self.now)
        self.mutations.extend(muts)

    def release(self, r: random.Random) -> None:
        _, muts, _events = self.engine.release("conn", self.now)
        self.mutations.extend(muts)

    ACTIONS = (push, push, push_bulk, pull, pull, finish, finish, control, tick, release)


def replayed(driver: Driver) -> Engine:
    records, queues = fold_mutations(driver.mutations)
    engine = Engine(EngineConfig(max_completed=100_000), seed=0)
    ordered = sorted(records.values(), key=lambda rec: rec["seq"])
    assert engine.restore(ordered, queues, driver.now, recover=False) == []
    return engine


@settings(max_examples=int(os.environ.get("SHARDQ_REPLAY_EXAMPLES", "60")), deadline=None)
@given(seed=st.integers(0, 2**32), steps=st.integers(1, 300))
def test_replay_rebuilds_the_same_queues(seed: int, steps: int) -> None:
    driver = Driver(seed)
    for _ in range(steps):
        driver.step()
    assert snapshot(replayed(driver)) == snapshot(driver.engine)


def test_replayed_engine_keeps_serving_in_the_same_order() -> None:
    driver = Driver(7)
    for _ in range(400):
        driver.step()
    twin = replayed(driver)
    for queue in QUEUES:
        driver.do({"cmd": "Resume", "queue": queue})
        twin.apply({"cmd": "Resume", "queue": queue}, driver.now)
        a = driver.engine.apply({"cmd": "PULLB", "queue": queue, "count": 1000}, driver.now).reply
        b = twin.apply({"cmd": "PULLB", "queue": queue, "count": 1000}, driver.now).reply
        assert [j["id"] for j in a["jobs"]] == [j["id"] for j in b["jobs"]]
