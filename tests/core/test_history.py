"""The per-minute history GetJobCounts answers with `history` (the dashboard's charts): pushes,
completions, failures and the wait/run time buckets, on the engine with a fake clock."""

from __future__ import annotations

from typing import Any

from shardq.core import Engine, EngineConfig, Mutation, fold_mutations

MINUTE = 60_000
START = 1_800_000_000_000  # a whole minute


class Q:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.engine = Engine(config, seed=1)
        self.now = START

    def cmd(self, **cmd: Any) -> dict[str, Any]:
        reply = self.engine.apply(cmd, self.now).reply
        return reply

    def history(self, minutes: int = 60) -> dict[str, Any]:
        reply = self.cmd(cmd="GetJobCounts", queue="q", history=minutes)
        assert reply["ok"], reply
        found: dict[str, Any] = reply["history"]
        return found


def bucket(bounds: list[int], ms: int) -> int:
    return next((i for i, b in enumerate(bounds) if ms <= b), len(bounds))


def test_pushes_completions_failures_and_times_per_minute() -> None:
    q = Q()
    for n in range(3):
        q.cmd(cmd="PUSH", queue="q", data=n, maxAttempts=1)
    q.cmd(cmd="PUSHB", queue="q", jobs=[{"data": 9}, {"data": 10}])
    q.now += 40  # the first job waited 40 ms
    first = q.cmd(cmd="PULL", queue="q", owner="w")
    q.now += 300  # and ran 300 ms
    assert q.cmd(cmd="ACK", id=first["job"]["id"], token=first["token"])["ok"]
    q.now = START + MINUTE + 10
    second = q.cmd(cmd="PULL", queue="q", owner="w")
    assert q.cmd(cmd="FAIL", id=second["job"]["id"], token=second["token"], error="x")["ok"]
    history = q.history()
    assert history["minuteMs"] == MINUTE
    bounds = history["bounds"]
    (t0, pushed, done, failed, wait, run), (t1, pushed1, done1, failed1, wait1, _) = history[
        "minutes"
    ]
    assert (t0, pushed, done, failed) == (START, 5, 1, 0)
    assert (t1, pushed1, done1, failed1, wait1) == (START + MINUTE, 0, 0, 1, None)
    assert sum(wait) == sum(run) == 1
    assert wait[bucket(bounds, 40)] == 1 and run[bucket(bounds, 300)] == 1
    # A window of one minute holds only the newest.
    assert [row[0] for row in q.history(1)["minutes"]] == [START + MINUTE]


def test_only_the_configured_minutes_are_kept() -> None:
    q = Q(EngineConfig(max_history_minutes=3))
    for _ in range(6):
        q.cmd(cmd="PUSH", queue="q", data={})
        q.now += MINUTE
    q.now -= MINUTE
    kept = q.history(60)["minutes"]
    assert [row[0] for row in kept] == [START + m * MINUTE for m in (3, 4, 5)]
    assert all(row[1] == 1 for row in kept)
    # Asked later, the minutes older than the window are left out.
    q.now += MINUTE
    assert [row[0] for row in q.history(2)["minutes"]] == [START + 5 * MINUTE]


def test_without_history_the_reply_is_bunqueues_and_an_unknown_queue_is_empty() -> None:
    q = Q()
    q.cmd(cmd="PUSH", queue="q", data={})
    assert "history" not in q.cmd(cmd="GetJobCounts", queue="q")
    reply = q.cmd(cmd="GetJobCounts", queue="other", history=60)
    assert reply["history"]["minutes"] == []


def test_get_jobs_filters_by_name() -> None:
    q = Q()
    q.cmd(cmd="PUSH", queue="q", name="send-invoice", data={})
    q.cmd(cmd="PUSH", queue="q", name="send-receipt", data={})
    q.cmd(cmd="PUSH", queue="q", name="resize", data={})
    names = [j["name"] for j in q.cmd(cmd="GetJobs", queue="q", name="send-")["jobs"]]
    assert sorted(names) == ["send-invoice", "send-receipt"]
    assert len(q.cmd(cmd="GetJobs", queue="q")["jobs"]) == 3


def test_a_restart_rebuilds_completions_and_failures_not_pushes() -> None:
    engine = Engine(seed=1)
    muts: list[Mutation] = []

    def cmd(now: int, **command: Any) -> dict[str, Any]:
        reply, out = (outcome := engine.apply(command, now)).reply, outcome.mutations
        muts.extend(out)
        return reply

    for _ in range(2):
        cmd(START, cmd="PUSH", queue="q", data={}, maxAttempts=1)
    first = cmd(START + 10, cmd="PULL", queue="q", owner="w")
    assert cmd(START + 60, cmd="ACK", id=first["job"]["id"], token=first["token"])["ok"]
    second = cmd(START + 70, cmd="PULL", queue="q", owner="w")
    assert cmd(START + 80, cmd="FAIL", id=second["job"]["id"], token=second["token"])["ok"]
    records, queues = fold_mutations(muts)
    back = Engine(seed=2)
    back.restore(records.values(), queues, START + 100)
    reply = back.apply({"cmd": "GetJobCounts", "queue": "q", "history": 60}, START + 100).reply
    ((at, pushed, done, failed, wait, run),) = reply["history"]["minutes"]
    assert (at, pushed, done, failed) == (START, 0, 1, 1)
    assert wait is not None and run is not None and sum(wait) == sum(run) == 1
