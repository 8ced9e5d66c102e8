"""The shard's memory release after a drain (`shardq.runtime.shard._memory`), on a real engine.

The RSS it saves is measured by `python -m bench.recovery`; here: that it runs when the job
count has halved from a large high-water mark, shrinks the tables, and changes no state.
"""

from __future__ import annotations

import sys
import time

import pytest

from shardq.core import Engine, EngineConfig
from shardq.runtime.shard import _memory
from shardq.runtime.shard._memory import MemoryReturner, malloc_trim
from tests.core.cold_model import ModelBacklog

NOW = 1_700_000_000_000


def drain_some(engine: Engine, queue: str, batches: int) -> None:
    for _ in range(batches):
        reply = engine.apply({"cmd": "PULLB", "queue": queue, "count": 100}, NOW).reply
        engine.apply({"cmd": "ACKB", "ids": [j["id"] for j in reply["jobs"]]}, NOW)


def test_a_drain_releases_memory_without_changing_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "RELEASE_FROM", 2000)
    engine = Engine(EngineConfig(max_completed=100), seed=1)
    returner = MemoryReturner(engine)
    for queue, n in (("a", 2000), ("b", 1800)):
        jobs = [{"data": i} for i in range(n)]
        engine.apply({"cmd": "PUSHB", "queue": queue, "jobs": jobs}, NOW)
        returner.after_turn(True, time.monotonic())
    assert returner.releases == 0
    jobs_table = engine.jobs
    size_full = sys.getsizeof(engine.jobs)
    drain_some(engine, "a", 15)  # 3,800 -> 2,400 jobs held: not yet halved
    returner.after_turn(True, time.monotonic())
    assert returner.releases == 0
    drain_some(engine, "a", 5)  # -> 1,900 (1,800 of "b" and 100 completed): halved
    returner.after_turn(True, time.monotonic())
    assert returner.releases == 1
    assert engine.jobs is jobs_table  # rebuilt in place: the queues share this dict
    assert sys.getsizeof(engine.jobs) < size_full  # a table sized for 1,900, not 3,800
    counts = engine.apply({"cmd": "GetJobCounts", "queue": "b"}, NOW).reply["counts"]
    assert counts["waiting"] == 1800
    # Everything still works on the rebuilt tables, in order.
    first = engine.apply({"cmd": "PULL", "queue": "b"}, NOW).reply["job"]
    assert first["data"] == 0
    drain_some(engine, "b", 20)
    assert engine.apply({"cmd": "GetJobCounts", "queue": "b"}, NOW).reply["counts"]["waiting"] == 0
    # The high-water mark is 1,900 now: below RELEASE_FROM.
    returner.after_turn(True, time.monotonic())
    assert returner.releases == 1


def test_malloc_trim_is_found_on_this_glibc_system() -> None:
    # The servers this project runs on are glibc Linux; a silent False would lose the trim.
    assert malloc_trim() is True


def test_a_shard_over_its_budget_trims_the_heap_at_most_so_often_and_only_once_it_grew() -> None:
    """`BudgetCheck`'s trim (`[process] shard_memory_trim_ms`): only while the process is
    over the budget, at most every `trim_every_ms`, and only after it grew by a 32nd of the
    budget since the last trim. The process's bytes are scripted here (the real trim runs);
    tests/runtime/test_memory_trim_server.py shows it on a real shard."""
    budget = 32 << 20
    engine = Engine(EngineConfig(), seed=1, backlog=ModelBacklog(), memory_bytes=budget)
    check = _memory.BudgetCheck(0, engine, lambda muts, events: None, trim_every_ms=1_000)
    memory = engine.memory
    assert memory is not None
    reads = [budget // 2]
    memory.process_bytes = lambda: reads[0]
    now = 10_000

    def step(used: int, dt: int = _memory.RSS_EVERY_MS) -> int:
        nonlocal now
        reads[0] = used
        for _ in range(2):  # a read, then the check that acts on it
            now += dt
            check.fit(now)
        return check.trims

    assert step(budget // 2) == 0  # under the budget: never
    assert step(budget + (8 << 20)) == 1  # over it: trimmed
    assert step(budget + (16 << 20)) == 1  # grew, but within the interval
    assert step(budget + (16 << 20), dt=600) == 2  # the interval passed, and it grew
    assert step(budget + (16 << 20), dt=600) == 2  # no growth since: not again
    assert step(budget + (24 << 20), dt=600) == 3
    off = _memory.BudgetCheck(0, engine, lambda muts, events: None, trim_every_ms=0)
    for _ in range(4):
        now += 2_000
        off.fit(now)
    assert off.trims == 0
