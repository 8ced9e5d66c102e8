"""Per-queue rate limit and concurrency cap in the engine: pulls never exceed them, parked pulls
are woken when capacity returns (a "ready" event, and a deadline for the rate window), and the
limits survive a restore."""

from __future__ import annotations

from typing import Any

import pytest

from shardq.core import Engine, Mutation, fold_mutations


class Q:
    def __init__(self) -> None:
        self.engine = Engine(seed=1)
        self.muts: list[Mutation] = []
        self.events: list[tuple[str, str, str]] = []  # of the last command
        self.now = 1_000_000

    def cmd(self, **cmd: Any) -> dict[str, Any]:
        outcome = self.engine.apply(cmd, self.now)
        self.muts.extend(outcome.mutations)
        self.events = outcome.events
        return outcome.reply

    def push(self, n: int, queue: str = "q") -> None:
        self.cmd(cmd="PUSHB", queue=queue, jobs=[{"data": i} for i in range(n)])

    def pull(self, count: int = 10, queue: str = "q", **extra: Any) -> list[dict[str, Any]]:
        return list(self.cmd(cmd="PULLB", queue=queue, count=count, **extra)["jobs"])

    def woken(self) -> set[str]:
        return {q for kind, q, _ in self.events if kind == "ready"}


def test_concurrency_caps_active_jobs_and_an_ack_wakes_the_queue() -> None:
    t = Q()
    t.push(10)
    assert t.cmd(cmd="SetConcurrency", queue="q", limit=3) == {"ok": True}
    first = t.pull(10)
    assert len(first) == 3
    assert t.pull(10) == []
    assert t.cmd(cmd="PULL", queue="q")["job"] is None
    assert t.cmd(cmd="GetJob", id=first[0]["id"])["ok"]
    assert t.woken() == set()  # a read frees nothing
    assert t.cmd(cmd="ACK", id=first[0]["id"], result=None)["ok"]
    assert t.woken() == {"q"}
    assert len(t.pull(10)) == 1


def test_fail_frees_a_slot_too() -> None:
    t = Q()
    t.push(5)
    t.cmd(cmd="SetConcurrency", queue="q", limit=1)
    (job,) = t.pull(5)
    assert t.pull(5) == []
    assert t.cmd(cmd="FAIL", id=job["id"], error="boom")["ok"]
    assert t.woken() == {"q"}
    assert len(t.pull(5)) == 1


def test_clear_concurrency_lifts_the_cap() -> None:
    t = Q()
    t.push(5)
    t.cmd(cmd="SetConcurrency", queue="q", limit=1)
    assert len(t.pull(5)) == 1
    t.cmd(cmd="ClearConcurrency", queue="q")
    assert t.woken() == {"q"}
    assert len(t.pull(5)) == 4


def test_rate_limit_holds_a_sliding_window_and_sets_a_deadline() -> None:
    t = Q()
    t.push(20)
    t.cmd(cmd="RateLimit", queue="q", limit=4, duration=1000)
    assert len(t.pull(10, owner="w")) == 4  # leased: no stall-check deadline in the way
    assert t.engine.next_deadline() == t.now + 1000
    t.now += 500
    assert t.pull(10, owner="w") == []
    t.now += 499
    assert t.engine.tick(t.now)[0] == []
    assert t.pull(10, owner="w") == []
    t.now += 1
    events, _ = t.engine.tick(t.now)
    assert ("ready", "q", "") in events
    assert len(t.pull(10, owner="w")) == 4


def test_rate_limit_is_never_exceeded_in_any_window() -> None:
    t = Q()
    t.push(500)
    t.cmd(cmd="RateLimit", queue="q", limit=7, duration=1000)
    times: list[int] = []
    start = t.now
    while t.now < start + 5000:
        times.extend([t.now] * len(t.pull(3)))
        for job_id in [j for j in list(t.engine.jobs) if t.engine.jobs[j].state == "active"]:
            t.cmd(cmd="ACK", id=job_id)
        t.now += 37
    assert len(times) >= 7 * 5
    for at in times:
        assert sum(1 for other in times if at <= other < at + 1000) <= 7


def test_rate_limit_clear_and_validation() -> None:
    t = Q()
    t.push(10)
    assert t.cmd(cmd="RateLimit", queue="q", limit="x") == {
        "ok": False,
        "error": "limit must be a finite number",
    }
    assert t.cmd(cmd="SetConcurrency", queue="q", limit=0)["ok"] is False
    for duration in (float("nan"), float("inf"), 0, "1s"):
        reply = t.cmd(cmd="RateLimit", queue="q", limit=1, duration=duration)
        assert reply == {"ok": False, "error": "duration must be a positive number"}
    assert t.cmd(cmd="RateLimit", queue="q", limit=float("inf"))["ok"] is False
    t.cmd(cmd="RateLimit", queue="q", limit=2)
    assert len(t.pull(10)) == 2
    t.cmd(cmd="RateLimitClear", queue="q")
    assert len(t.pull(10)) == 8
    assert t.engine.queues["q"].limits is None


def test_limits_are_persisted_and_restored() -> None:
    t = Q()
    t.push(6)
    t.cmd(cmd="SetConcurrency", queue="q", limit=2)
    t.cmd(cmd="RateLimit", queue="q", limit=100, duration=60_000)
    records, queues = fold_mutations(t.muts)
    assert queues["q"]["limits"] == {"rate": 100, "window": 60_000, "concurrency": 2}
    back = Engine(seed=2)
    back.restore(records.values(), queues, t.now)
    reply = back.apply({"cmd": "PULLB", "queue": "q", "count": 6, "owner": "w"}, t.now).reply
    assert len(reply["jobs"]) == 2
    assert back.queues["q"].limits is not None
    reply = back.apply({"cmd": "PULLB", "queue": "q", "count": 6, "owner": "w"}, t.now).reply
    assert reply["jobs"] == []
    assert back.limiter.blocked == {"q"}  # watched for capacity from now on


@pytest.mark.parametrize("limited", [False, True])
def test_other_queues_are_untouched(limited: bool) -> None:
    t = Q()
    t.push(5, "free")
    t.push(5, "q")
    if limited:
        t.cmd(cmd="SetConcurrency", queue="q", limit=1)
    assert len(t.pull(5, "free")) == 5
    assert t.engine.queues["free"].limits is None


def test_a_timeout_frees_a_slot_and_the_tick_wakes_the_queue() -> None:
    t = Q()
    jobs = [{"data": i, "timeout": 100, "maxAttempts": 1} for i in range(2)]
    t.cmd(cmd="PUSHB", queue="q", jobs=jobs)
    t.cmd(cmd="SetConcurrency", queue="q", limit=1)
    assert len(t.pull(2, owner="w")) == 1
    assert t.pull(2, owner="w") == []
    t.now += 100
    events, _ = t.engine.tick(t.now)
    assert ("timeout", "q") in {(kind, q) for kind, q, _ in events}
    assert ("ready", "q", "") in events
    assert len(t.pull(2, owner="w")) == 1
