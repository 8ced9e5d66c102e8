"""Weeks of uptime, at engine level with a fake clock (time is an argument of every call).

Three simulated weeks of traffic, an hour per round: jobs pushed (some with unique keys and
results), worked, some left to lapse their lease, some outliving their `timeout` (a retired
delivery), some failing forever in a queue of their own.
Every collection that grows with history stays within its cap at every round, far past each
limit; the forever-failing queue's DLQ stays within `maxEntries` and its entries stay
retryable. `SHARDQ_ADVERSARIAL_WEEKS` runs longer (default 3).
"""

from __future__ import annotations

import os
from typing import Any

from shardq.core import Engine, EngineConfig

WEEKS = int(os.environ.get("SHARDQ_ADVERSARIAL_WEEKS", "3"))
HOUR_MS = 3_600_000
PER_HOUR = 40  # jobs per round: 3 weeks = 504 rounds, 20,160 jobs, far past every cap below
DLQ_MAX = 25
CAPS = EngineConfig(
    max_completed=200, max_results=100, max_dedup_keys=100, max_finalized=100,
    max_dep_completions=100,
)  # fmt: skip


def ok(engine: Engine, now: int, **cmd: Any) -> dict[str, Any]:
    reply = engine.apply(cmd, now).reply
    assert reply.get("ok") is True, (cmd, reply)
    return reply


def hour(engine: Engine, r: int, now: int) -> None:
    """One round: push, work, let one lease lapse, fail the bad queue's jobs."""
    jobs = [{"data": i, "uniqueKey": f"u{r}-{i}"} if i % 2 else {"data": i}
            for i in range(PER_HOUR)]  # fmt: skip
    ok(engine, now, cmd="PUSHB", queue="good", jobs=jobs)
    got = ok(engine, now, cmd="PULLB", queue="good", count=PER_HOUR, owner="w", lockTtl=60_000)
    ids, tokens = [j["id"] for j in got["jobs"]], got["tokens"]
    # The last job's lease lapses (its worker vanished); the rest complete with a result.
    ok(engine, now + 1, cmd="ACKB", ids=ids[:-1], tokens=tokens[:-1], results=[r] * (len(ids) - 1))
    ok(engine, now, cmd="PUSH", queue="bad", data=r, maxAttempts=1)
    bad = ok(engine, now, cmd="PULL", queue="bad", owner="w")
    ok(engine, now, cmd="FAIL", id=bad["job"]["id"], token=bad["token"], error="always")
    # A job whose handler outlives its `timeout`: the delivery is retired (finalized).
    ok(engine, now, cmd="PUSH", queue="slow", data=r, maxAttempts=1, timeout=1000)
    ok(engine, now, cmd="PULL", queue="slow", owner="w")
    engine.tick(now + 120_000)  # past the lease: the lapsed job goes back to waiting
    again = ok(engine, now + 120_000, cmd="PULLB", queue="good", count=10, owner="w2")
    if again["jobs"]:
        ok(engine, now + 120_001, cmd="ACKB", ids=[j["id"] for j in again["jobs"]],
           tokens=again["tokens"])  # fmt: skip
    # The first holder's late ACK after the re-lease: refused, never a second completion.
    late = engine.apply({"cmd": "ACK", "id": ids[-1], "token": tokens[-1]}, now + 120_002).reply
    assert late.get("ok") is False, late


def caps_held(engine: Engine) -> dict[str, int]:
    sizes = {
        "completed_order": len(engine.store.completed_order),
        "results_order": len(engine.store.results_order),
        "unique": len(engine.store.unique),
        "finalized": len(engine.store.finalized),
        "dep_done": len(engine.store.dep_done),
        "leases": len(engine.store.leases),
        "jobs": len(engine.jobs),
    }
    assert sizes["completed_order"] <= CAPS.max_completed
    assert sizes["results_order"] <= CAPS.max_results
    assert sizes["unique"] <= CAPS.max_dedup_keys
    assert sizes["finalized"] <= CAPS.max_finalized
    assert sizes["dep_done"] <= CAPS.max_dep_completions
    assert sizes["leases"] == 0  # every round ends with nothing held
    # Jobs in memory: the completed ones kept, the DLQ, nothing else piling up.
    assert sizes["jobs"] <= CAPS.max_completed + 2 * DLQ_MAX + PER_HOUR
    return sizes


def test_weeks_of_uptime_hold_every_cap_and_a_bounded_retryable_dlq() -> None:
    engine = Engine(CAPS, seed=7)
    now = 1_700_000_000_000
    for queue in ("bad", "slow"):
        ok(engine, now, cmd="SetDlqConfig", queue=queue, config={"maxEntries": DLQ_MAX})
    rounds = WEEKS * 7 * 24
    for r in range(rounds):
        hour(engine, r, now)
        now += HOUR_MS
        engine.tick(now)
        caps_held(engine)
        assert len(ok(engine, now, cmd="Dlq", queue="bad")["jobs"]) <= DLQ_MAX
        assert len(ok(engine, now, cmd="Dlq", queue="slow")["jobs"]) <= DLQ_MAX
    assert (
        engine.apply({"cmd": "GetJobCounts", "queue": "good"}, now).reply["counts"]["waiting"] == 0
    )
    dlq = ok(engine, now, cmd="Dlq", queue="bad")["jobs"]
    assert len(dlq) == DLQ_MAX  # full, and bounded: rounds far exceeds it
    assert ok(engine, now, cmd="RetryDlq", queue="bad")["count"] == DLQ_MAX
    retried = ok(engine, now, cmd="PULLB", queue="bad", count=DLQ_MAX * 2, owner="w")
    assert len(retried["jobs"]) == DLQ_MAX  # every entry came back and runs again
    ok(engine, now, cmd="ACKB", ids=[j["id"] for j in retried["jobs"]], tokens=retried["tokens"])
    print(f"uptime: {rounds} simulated hours, {rounds * (PER_HOUR + 2)} jobs, "
          f"sizes at the end {caps_held(engine)}")  # fmt: skip
