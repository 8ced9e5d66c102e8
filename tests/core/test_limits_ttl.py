"""RateLimit's `ttl` (a rate limit that clears itself at a shard deadline, across a restore too)
and GetQueueLimits, the read of a queue's limits."""

from __future__ import annotations

from typing import Any

from shardq.core import Engine, Mutation, fold_mutations

NOW = 1_000_000


class L:
    def __init__(self) -> None:
        self.engine = Engine(seed=1)
        self.muts: list[Mutation] = []
        self.now = NOW

    def cmd(self, **cmd: Any) -> dict[str, Any]:
        reply, muts = (outcome := self.engine.apply(cmd, self.now)).reply, outcome.mutations
        self.muts.extend(muts)
        return reply

    def limits(self, **extra: Any) -> dict[str, Any]:
        reply = self.cmd(cmd="GetQueueLimits", queue="q", **extra)
        assert reply["ok"], reply
        return dict(reply["data"]["limits"])

    def pull(self, count: int) -> int:
        return len(self.cmd(cmd="PULLB", queue="q", count=count, owner="w")["jobs"])


NO_LIMITS = {"rateLimit": None, "rateLimitTtl": -2, "concurrencyLimit": None, "maxed": False}


def test_get_queue_limits_reads_what_is_set_and_whether_it_is_reached() -> None:
    t = L()
    assert t.limits() == NO_LIMITS
    t.cmd(cmd="PUSHB", queue="q", jobs=[{"data": i} for i in range(5)])
    t.cmd(cmd="RateLimit", queue="q", limit=3, duration=2000)
    t.cmd(cmd="SetConcurrency", queue="q", limit=4)
    expected = {
        "rateLimit": {"max": 3, "duration": 2000},
        "rateLimitTtl": 0,
        "concurrencyLimit": 4,
        "maxed": False,
    }
    assert t.limits() == expected
    assert t.pull(5) == 3
    t.now += 500
    assert t.limits() == {**expected, "rateLimitTtl": 1500, "maxed": True}
    assert t.limits(maxJobs=10)["rateLimitTtl"] == 0  # 3 deliveries do not fill a window of 10
    t.cmd(cmd="RateLimitClear", queue="q")
    assert t.pull(5) == 1  # the cap of 4 active is reached
    assert t.limits() == {**NO_LIMITS, "concurrencyLimit": 4, "maxed": True}
    bad = t.cmd(cmd="GetQueueLimits", queue="q", maxJobs="x")
    assert bad == {"ok": False, "error": "maxJobs must be a finite number"}


def test_a_rate_limit_with_a_ttl_clears_itself_at_its_deadline() -> None:
    t = L()
    t.cmd(cmd="PUSHB", queue="q", jobs=[{"data": i} for i in range(5)])
    assert t.cmd(cmd="RateLimit", queue="q", limit=1, duration=60_000, ttl=3000)["ok"]
    assert t.pull(5) == 1
    assert t.pull(5) == 0
    deadline = t.engine.next_deadline()
    assert deadline is not None and deadline <= NOW + 3000
    events, muts = t.engine.tick(NOW + 2999)
    assert t.engine.queues["q"].limits is not None
    t.now = NOW + 3000
    events, muts = t.engine.tick(t.now)
    assert ("ready", "q", "") in events  # parked pulls are served at once
    assert any(m[0] == "queue" for m in muts)  # and the clearing is persisted
    assert t.limits() == NO_LIMITS
    assert t.pull(5) == 4


def test_a_rate_limit_set_again_without_ttl_is_permanent() -> None:
    t = L()
    t.cmd(cmd="RateLimit", queue="q", limit=1, ttl=1000)
    t.cmd(cmd="RateLimit", queue="q", limit=2)
    t.engine.tick(NOW + 5000)
    assert t.limits()["rateLimit"] == {"max": 2, "duration": 1000}
    bad = t.cmd(cmd="RateLimit", queue="q", limit=1, ttl=0)
    assert bad == {"ok": False, "error": "ttl must be a positive number"}


def test_a_ttl_that_passed_while_down_clears_after_a_restore() -> None:
    t = L()
    t.cmd(cmd="PUSHB", queue="q", jobs=[{"data": i} for i in range(3)])
    t.cmd(cmd="RateLimit", queue="q", limit=1, ttl=1000)
    records, queues = fold_mutations(t.muts)
    assert queues["q"]["limits"]["rateUntil"] == NOW + 1000
    back = Engine(seed=2)
    back.restore(records.values(), queues, NOW + 10_000)
    deadline = back.next_deadline()
    assert deadline is not None and deadline <= NOW + 1000
    back.tick(NOW + 10_000)
    reply = back.apply({"cmd": "PULLB", "queue": "q", "count": 3}, NOW + 10_000).reply
    assert len(reply["jobs"]) == 3
