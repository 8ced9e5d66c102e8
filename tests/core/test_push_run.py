"""`Engine.push_run`: consecutive PUSHes in one pass must be exactly the same PUSHes applied one
by one (ids, sequence numbers, replies, mutations, state), of one queue or of several in turn
(pipelined pushes spread over queues), whose mutations come grouped by queue.

Two engines with the same seed get the same commands: one through `push_run` and then `apply`
for those it did not take (from the first push with options, a bad payload or a bad queue),
the other through `apply`, one command at a time.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardq.core import Engine, EngineConfig
from tests.core.test_batch_paths import state_of

PLAIN = st.fixed_dictionaries(
    {"data": st.one_of(st.integers(0, 9), st.fixed_dictionaries({"name": st.just("old")}))},
    optional={"name": st.sampled_from(("n", "")), "reqId": st.just("r")},
)
# Anything that leaves the plain path or fails there.
OTHER = st.one_of(
    PLAIN.map(lambda c: {**c, "priority": 3}),
    PLAIN.map(lambda c: {**c, "jobId": "custom"}),
    PLAIN.map(lambda c: {**c, "durable": True}),
    PLAIN.map(lambda c: {**c, "name": 5}),
    PLAIN.map(lambda c: {**c, "queue": ""}),  # refused: no queue name
)
QUEUES = st.sampled_from(("q", "q", "other", "third"))
RUNS = st.lists(st.lists(st.one_of(PLAIN, PLAIN, PLAIN, OTHER), min_size=1, max_size=6), max_size=5)


def _commands(queue: str, run: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"cmd": "PUSH", "queue": queue, **fields} for fields in run]


def _by_queue(commands: list[dict[str, Any]], parts: list[list[Any]]) -> list[Any]:
    """Each command's part (mutations, events), the queues' in the order each first appears."""
    order = list(dict.fromkeys(cmd["queue"] for cmd in commands))
    pairs = list(zip(commands, parts, strict=True))
    return [p for q in order for cmd, part in pairs if cmd["queue"] == q for p in part]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs=RUNS, queues=st.lists(QUEUES, min_size=30, max_size=30), pulled=st.booleans())
def test_a_run_of_pushes_is_its_pushes_one_by_one(
    runs: list[list[dict[str, Any]]], queues: list[str], pulled: bool
) -> None:
    config = EngineConfig()
    fast, slow = Engine(config, seed=3), Engine(config, seed=3)
    now = 1_700_000_000_000
    spread = iter(queues)
    for run in runs:
        now += 7
        commands = [{"cmd": "PUSH", "queue": next(spread), **fields} for fields in run]
        got = fast.push_run(commands, now)
        expected = [slow.apply(cmd, now) for cmd in commands]
        assert got is not None  # no budget, no limit here
        outcome, ids = got
        taken = expected[: len(ids)]
        for cmd in commands[: len(ids)]:
            assert set(cmd) <= {"data", "name", "reqId", "cmd", "queue"}
        assert [{"ok": True, "id": job_id} for job_id in ids] == [o.reply for o in taken]
        took = commands[: len(ids)]
        assert outcome.mutations == _by_queue(took, [o.mutations for o in taken])
        assert outcome.events == _by_queue(took, [o.events for o in taken])
        if len(ids) < len(commands):  # the first one not taken is no plain push
            first = commands[len(ids)]
            assert (
                set(first) - {"data", "name", "reqId", "cmd", "queue"}
                or expected[len(ids)].reply["ok"] is False
            )
        rest = [fast.apply(cmd, now) for cmd in commands[len(ids) :]]
        assert [o.reply for o in rest] == [o.reply for o in expected[len(ids) :]]
        assert [o.mutations for o in rest] == [o.mutations for o in expected[len(ids) :]]
        assert state_of(fast) == state_of(slow)
        if pulled:  # the jobs of a run move on like the others
            for queue in ("q", "other", "third"):
                pull = {"cmd": "PULLB", "queue": queue, "count": 2, "owner": "w"}
                assert fast.apply(pull, now).reply == slow.apply(pull, now).reply


def test_pushes_spread_over_queues_in_turn_are_one_run() -> None:
    """Pipelined pushes over several queues (push8q): one pass for all, the ids and sequence
    numbers in arrival order, each queue's jobs placed together and in its own order."""
    fast, slow = Engine(seed=5), Engine(seed=5)
    now = 1_700_000_000_000
    commands = [{"cmd": "PUSH", "queue": f"q{i % 4}", "data": i} for i in range(12)]
    got = fast.push_run(commands, now)
    assert got is not None
    outcome, ids = got
    assert ids == [slow.apply(cmd, now).reply["id"] for cmd in commands]
    seqs = [fast.find(job_id).seq for job_id in ids]  # type: ignore[union-attr]
    assert seqs == sorted(seqs)
    assert [m[1]["queue"] for m in outcome.mutations] == [f"q{i // 3}" for i in range(12)]
    assert [m[1]["data"] for m in outcome.mutations] == [i % 3 * 4 + i // 3 for i in range(12)]
    assert state_of(fast) == state_of(slow)
    for q in range(4):
        pull = {"cmd": "PULLB", "queue": f"q{q}", "count": 5, "owner": "w"}
        assert fast.apply(pull, now).reply == slow.apply(pull, now).reply


def test_a_run_is_declined_while_a_limiter_holds_jobs_back() -> None:
    engine = Engine(seed=1)
    now = 1_700_000_000_000
    assert engine.apply({"cmd": "SetConcurrency", "queue": "q", "limit": 1}, now).reply["ok"]
    pushes = _commands("q", [{"data": 1}, {"data": 2}])
    assert engine.push_run(pushes, now) is not None
    assert engine.apply({"cmd": "PULL", "queue": "q", "owner": "w"}, now).reply["job"]
    assert engine.apply({"cmd": "PULL", "queue": "q", "owner": "w"}, now).reply["job"] is None
    assert engine.limiter.blocked == {"q"}  # the second job is held back by the limit
    assert engine.push_run(pushes, now) is None
