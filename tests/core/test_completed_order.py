"""The completed jobs' order (`shardq.core._order`) behaves as the OrderedDict it replaced.

Random appends, removals from the middle (an id may come back after it left) and pops of the
oldest, the same on a `CompletedOrder` and on an `OrderedDict` model: the same length, the
same ids in the same order, the same oldest, at every step; and the deque never holds more
than twice the live ids plus the slack. Then on a real engine: completed jobs removed,
retried and completed again are evicted in completion order.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.core import Engine, EngineConfig
from shardq.core._order import _SLACK, CompletedOrder

NOW = 1_700_000_000_000


def _check(order: CompletedOrder, model: OrderedDict[str, None]) -> None:
    assert len(order) == len(model)
    assert bool(order) == bool(model)
    assert list(order) == list(model)
    if model:
        assert order.oldest() == next(iter(model))
    assert len(order._ids) <= 2 * len(model) + _SLACK + 1


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 400))
def test_the_order_matches_an_ordered_dict(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    order, model = CompletedOrder(), OrderedDict[str, None]()
    pool = [f"j{i}" for i in range(rng.randint(1, 60))]
    for _ in range(steps):
        op = rng.random()
        out = [i for i in pool if i not in model]
        if op < 0.5 and out:
            job_id = rng.choice(out)
            order.append(job_id)
            model[job_id] = None
        elif op < 0.8 and model:
            job_id = rng.choice(list(model))
            order.discard(job_id)
            del model[job_id]
        elif model:
            assert order.pop_oldest() == model.popitem(last=False)[0]
        _check(order, model)
    order.compact()
    _check(order, model)
    assert not order._gone and len(order._ids) == len(model)


def _run(engine: Engine, cmd: dict[str, Any], now: int = NOW) -> dict[str, Any]:
    reply: dict[str, Any] = engine.apply(cmd, now).reply
    return reply


def _complete(engine: Engine, queue: str, now: int) -> str:
    job = _run(engine, {"cmd": "PULL", "queue": queue}, now)["job"]
    assert _run(engine, {"cmd": "ACK", "id": job["id"], "token": job.get("token")}, now)["ok"]
    return str(job["id"])


def test_jobs_that_leave_the_completed_order_and_return_are_evicted_in_order() -> None:
    engine = Engine(EngineConfig(max_completed=4), seed=2)
    ids = [_run(engine, {"cmd": "PUSH", "queue": "q", "data": {"i": i}})["id"] for i in range(8)]
    done = [_complete(engine, "q", NOW + i) for i in range(4)]
    assert done == ids[:4]
    # The oldest goes back to waiting and completes again: now the newest.
    assert _run(engine, {"cmd": "RetryCompleted", "queue": "q", "id": done[0]})["ok"]
    assert _complete(engine, "q", NOW + 10) == done[0]
    assert list(engine.store.completed_order) == [*done[1:], done[0]]
    # Clean takes the two that finished first, the oldest and the one after it.
    clean = {"cmd": "Clean", "queue": "q", "state": "completed", "grace": 98, "limit": 2}
    assert _run(engine, clean, NOW + 100)["ids"] == done[1:3]
    assert list(engine.store.completed_order) == [done[3], done[0]]
    # Three more complete: the cap (4) evicts the oldest first, skipping the cleaned ones.
    more = [_complete(engine, "q", NOW + 200 + i) for i in range(3)]
    assert list(engine.store.completed_order) == [done[0], *more]
    for gone in (done[1], done[2], done[3]):
        assert _run(engine, {"cmd": "GetJob", "id": gone}).get("job") is None
    state = _run(engine, {"cmd": "GetJobCounts", "queue": "q"})["counts"]
    assert state["completed"] == 4, state
