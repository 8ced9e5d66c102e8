"""Cron schedules in the engine, on a fake clock: slots, DST, clock jumps, limits, restarts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from shardq.core import Engine, Mutation, fold_mutations

SECOND = 1000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, tz: str = "UTC") -> int:
    zone = UTC if tz == "UTC" else ZoneInfo(tz)
    return int(datetime(year, month, day, hour, minute, tzinfo=zone).timestamp() * 1000)


class Clock:
    """An engine driven by hand, keeping every mutation (what the writer would store)."""

    def __init__(self, now: int, engine: Engine | None = None) -> None:
        self.engine = engine or Engine(seed=1)
        self.now = now
        self.muts: list[Mutation] = []

    def cmd(self, **cmd: Any) -> dict[str, Any]:
        reply, muts = (outcome := self.engine.apply(cmd, self.now)).reply, outcome.mutations
        self.muts.extend(muts)
        return reply

    def cron(self, **fields: Any) -> dict[str, Any]:
        fields.setdefault("queue", "q")
        fields.setdefault("data", {"n": 1})
        reply = self.cmd(cmd="Cron", **fields)
        assert reply["ok"], reply
        return reply

    def at(self, now: int) -> list[str]:
        """Tick at `now`; return the ids of the jobs the schedules pushed."""
        self.now = now
        events, muts = self.engine.tick(now)
        self.muts.extend(muts)
        return [job_id for kind, _queue, job_id in events if kind == "cron"]

    def run_until(self, end: int, step: int) -> list[int]:
        """Tick every `step` ms up to `end`; return the times of the ticks that fired."""
        fired: list[int] = []
        t = self.now
        while t < end:
            t += step
            if self.at(t):
                fired.append(t)
        return fired

    def restarted(self, now: int) -> Clock:
        """A fresh engine restored from what was stored, as a shard does at start."""
        crons: dict[str, Any] = {}
        records, queues = fold_mutations(self.muts, crons=crons)
        clock = Clock(now)
        clock.muts = list(self.muts)
        clock.muts.extend(clock.engine.restore(records.values(), queues, now, crons=crons.values()))
        return clock

    def waiting(self, queue: str = "q") -> int:
        return int(self.cmd(cmd="Count", queue=queue)["count"])


# -- commands --------------------------------------------------------------------------------


def test_cron_get_list_delete() -> None:
    c = Clock(ms(2026, 1, 1))
    made = c.cron(name="b", schedule="0 * * * *")["cron"]
    c.cron(name="a", repeatEvery=5000, queue="other")
    assert made["nextRun"] == ms(2026, 1, 1, 1)
    assert c.cmd(cmd="CronGet", name="b")["cron"]["schedule"] == "0 * * * *"
    assert [x["name"] for x in c.cmd(cmd="CronList")["crons"]] == ["a", "b"]
    assert c.cmd(cmd="CronDelete", name="b") == {"ok": True}
    assert c.cmd(cmd="CronGet", name="b") == {"ok": False, "error": "Cron job not found"}
    assert c.cmd(cmd="CronDelete", name="b") == {"ok": False, "error": "Cron job not found"}
    assert any(m[:2] == ("crondel", "b") and len(m) == 3 for m in c.muts)  # with its queue
    assert c.at(ms(2026, 1, 1) + 5000) == [c.engine.cron.schedules["a"]["lastJobId"]]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"schedule": "* * *"}, "Invalid cron expression: * * *"),
        ({"schedule": "61 * * * *"}, "Invalid cron expression: 61 * * * *"),
        ({"schedule": "0 * * * *", "timezone": "Mars/Base"}, "Invalid timezone: Mars/Base"),
        ({}, "Cron needs exactly one of schedule and repeatEvery"),
        ({"schedule": "0 * * * *", "repeatEvery": 5}, "Cron needs exactly one of schedule"),
        ({"repeatEvery": -1}, "repeatEvery must be a positive integer"),
        ({"repeatEvery": float("inf")}, "repeatEvery must be a positive integer"),
        ({"repeatEvery": 5, "maxLimit": float("nan")}, "maxLimit must be a number"),
        ({"schedule": "0 0 30 2 *"}, "Cron expression has no future slot: 0 0 30 2 *"),
    ],
)
def test_invalid_schedules_are_refused(fields: dict[str, Any], error: str) -> None:
    c = Clock(0)
    reply = c.cmd(cmd="Cron", name="x", queue="q", data={}, **fields)
    assert reply["ok"] is False
    assert reply["error"].startswith(error)
    assert c.muts == []


@pytest.mark.parametrize("name", [["a"], {"a": 1}, None, 7])
def test_odd_names_are_not_found(name: Any) -> None:
    c = Clock(0)
    for cmd in ("CronGet", "CronDelete"):
        assert c.cmd(cmd=cmd, name=name) == {"ok": False, "error": "Cron job not found"}


def test_six_fields_lead_with_seconds() -> None:
    c = Clock(ms(2026, 1, 1))
    assert c.cron(name="s", schedule="*/10 * * * * *")["cron"]["nextRun"] == ms(2026, 1, 1) + 10_000


def test_upsert_keeps_the_count_and_never_refires_the_last_slot() -> None:
    c = Clock(ms(2026, 1, 1))
    c.cron(name="s", schedule="* * * * *", preventOverlap=False)
    assert len(c.at(ms(2026, 1, 1, 0, 1))) == 1
    again = c.cron(name="s", schedule="* * * * *", preventOverlap=False)["cron"]
    assert again["executions"] == 1
    assert again["nextRun"] == ms(2026, 1, 1, 0, 2)


# -- firing ----------------------------------------------------------------------------------


def test_every_second_fires_each_slot_once_and_wakes_on_time() -> None:
    c = Clock(10 * SECOND)
    c.cron(name="tick", repeatEvery=SECOND, preventOverlap=False)
    assert c.engine.next_deadline() == 11 * SECOND
    fired = c.run_until(20 * SECOND, 250)
    assert fired == [s * SECOND for s in range(11, 21)]
    assert c.waiting() == 10
    assert c.engine.cron.schedules["tick"]["executions"] == 10


def test_immediately_fires_at_the_first_tick() -> None:
    c = Clock(5 * SECOND)
    c.cron(name="now", repeatEvery=HOUR, immediately=True)
    assert c.engine.next_deadline() == 5 * SECOND
    assert len(c.at(5 * SECOND)) == 1
    assert c.engine.next_deadline() == 5 * SECOND + HOUR


def test_fired_jobs_carry_the_schedule_options() -> None:
    c = Clock(0)
    c.cron(
        name="opts",
        repeatEvery=SECOND,
        jobName="report",
        priority=7,
        data={"k": "v"},
        jobOptions={"maxAttempts": 9, "timeout": 500, "unknownKey": 1},
    )
    (job_id,) = c.at(SECOND)
    job = c.cmd(cmd="GetJob", id=job_id)["job"]
    assert (job["name"], job["priority"], job["data"], job["maxAttempts"]) == (
        "report",
        7,
        {"k": "v"},
        9,
    )
    assert job["timeout"] == 500
    assert job["createdAt"] == SECOND  # the slot it fired for


def test_a_late_job_carries_its_slot_as_timestamp() -> None:
    c = Clock(0)
    c.cron(name="late", repeatEvery=MINUTE)
    (job_id,) = c.at(MINUTE + 7 * SECOND)
    assert c.cmd(cmd="GetJob", id=job_id)["job"]["createdAt"] == MINUTE


def test_max_limit_removes_the_schedule() -> None:
    c = Clock(0)
    c.cron(name="three", repeatEvery=SECOND, maxLimit=3, preventOverlap=False)
    assert c.run_until(10 * SECOND, SECOND) == [SECOND, 2 * SECOND, 3 * SECOND]
    assert c.cmd(cmd="CronGet", name="three")["error"] == "Cron job not found"
    assert c.engine.next_deadline() is None or c.engine.next_deadline() != 4 * SECOND
    assert c.waiting() == 3


def test_prevent_overlap_skips_slots_while_the_last_job_lives() -> None:
    c = Clock(0)
    c.cron(name="solo", repeatEvery=SECOND)
    assert len(c.at(SECOND)) == 1
    assert c.at(2 * SECOND) == []  # the first job still waits
    job = c.cmd(cmd="PULL", queue="q")["job"]
    assert c.cmd(cmd="ACK", id=job["id"])["ok"]
    assert len(c.at(3 * SECOND)) == 1
    assert c.engine.cron.schedules["solo"]["executions"] == 2


def test_overlap_allowed_fires_every_slot() -> None:
    c = Clock(0)
    c.cron(name="many", repeatEvery=SECOND, preventOverlap=False)
    assert c.run_until(3 * SECOND, SECOND) == [SECOND, 2 * SECOND, 3 * SECOND]


# -- clock jumps -----------------------------------------------------------------------------


def test_a_backward_jump_never_fires_a_slot_twice() -> None:
    c = Clock(ms(2026, 1, 1))
    c.cron(name="m", schedule="* * * * *", preventOverlap=False)
    assert len(c.at(ms(2026, 1, 1, 0, 1))) == 1
    # The wall clock steps back ten minutes, then walks forward past the slot again.
    c.now = ms(2026, 1, 1) - 10 * MINUTE
    fired = c.run_until(ms(2026, 1, 1, 0, 1) + 30 * SECOND, 5 * SECOND)
    assert fired == []
    assert c.at(ms(2026, 1, 1, 0, 2)) != []


@pytest.mark.parametrize(("skip", "expected"), [(True, 0), (False, 1)])
def test_a_forward_jump_fires_the_missed_slot_once_or_skips_it(skip: bool, expected: int) -> None:
    c = Clock(ms(2026, 1, 1))
    c.cron(name="m", schedule="* * * * *", preventOverlap=False, skipMissedOnRestart=skip)
    jumped = ms(2026, 1, 1, 5) + 30 * SECOND  # five hours of slots missed at once
    assert len(c.at(jumped)) == expected
    assert c.engine.cron.schedules["m"]["nextRun"] == ms(2026, 1, 1, 5, 1)
    assert c.at(jumped + SECOND) == []  # no backlog follows


def test_a_late_tick_within_one_interval_still_fires() -> None:
    c = Clock(0)
    c.cron(name="m", repeatEvery=MINUTE, preventOverlap=False)
    assert len(c.at(MINUTE + 20 * SECOND)) == 1
    assert c.engine.cron.schedules["m"]["nextRun"] == 2 * MINUTE


# -- daylight saving time --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "day", "utc_fire"),
    [
        # 02:30 does not exist on these days; the slot becomes the first valid instant after.
        ("America/New_York", (2026, 3, 8), ms(2026, 3, 8, 7)),
        ("Europe/Berlin", (2026, 3, 29), ms(2026, 3, 29, 1)),
    ],
)
def test_spring_forward_resolves_to_a_valid_future_instant(
    tz: str, day: tuple[int, int, int], utc_fire: int
) -> None:
    c = Clock(ms(*day, 0, 0, tz=tz))
    slot = c.cron(name="dst", schedule="30 2 * * *", timezone=tz, preventOverlap=False)["cron"]
    assert slot["nextRun"] == utc_fire
    assert slot["nextRun"] > c.now
    fired = c.run_until(c.now + 48 * HOUR, MINUTE)
    assert fired == [utc_fire, ms(day[0], day[1], day[2] + 1, 2, 30, tz=tz)]


@pytest.mark.parametrize(
    ("tz", "day", "hour"),
    [
        ("America/New_York", (2026, 11, 1), 1),  # 01:00-02:00 happens twice
        ("Europe/Berlin", (2026, 10, 25), 2),  # 02:00-03:00 happens twice
    ],
)
def test_fall_back_fires_a_daily_slot_once(tz: str, day: tuple[int, int, int], hour: int) -> None:
    c = Clock(ms(*day, 0, 0, tz=tz) - HOUR)
    c.cron(name="dst", schedule=f"30 {hour} * * *", timezone=tz, preventOverlap=False)
    fired = c.run_until(c.now + 20 * HOUR, MINUTE)
    assert fired == [ms(*day, hour, 30, tz=tz)]  # the first of the two 01:30s (or 02:30s)
    for t in fired:
        assert t > ms(*day, 0, 0, tz=tz)


def test_fall_back_hour_keeps_wall_times_moving_forward() -> None:
    tz = "America/New_York"
    c = Clock(ms(2026, 11, 1, 0, 50, tz=tz))
    c.cron(name="q", schedule="*/20 * * * *", timezone=tz, preventOverlap=False)
    fired = c.run_until(ms(2026, 11, 1, 3, 0, tz=tz), MINUTE)
    walls = [datetime.fromtimestamp(t / 1000, ZoneInfo(tz)).strftime("%H:%M") for t in fired]
    assert walls == ["01:00", "01:20", "01:40", "02:00", "02:20", "02:40", "03:00"]
    assert fired == sorted(set(fired))


# -- restarts --------------------------------------------------------------------------------


def test_a_slot_fired_before_a_restart_never_fires_again() -> None:
    c = Clock(0)
    c.cron(name="m", repeatEvery=MINUTE, preventOverlap=False)
    (job_id,) = c.at(MINUTE)
    back = c.restarted(MINUTE)
    assert back.engine.cron.schedules["m"]["lastJobId"] == job_id
    assert back.at(MINUTE) == []
    assert back.at(MINUTE + 30 * SECOND) == []
    assert len(back.at(2 * MINUTE)) == 1
    assert back.waiting() == 2


def test_restore_skips_slots_missed_while_down_by_default() -> None:
    c = Clock(0)
    c.cron(name="m", repeatEvery=MINUTE, preventOverlap=False)
    back = c.restarted(10 * MINUTE + 5 * SECOND)
    assert back.engine.cron.schedules["m"]["nextRun"] == 11 * MINUTE
    assert back.engine.next_deadline() == 11 * MINUTE
    assert back.at(10 * MINUTE + 6 * SECOND) == []
    assert len(back.at(11 * MINUTE)) == 1


def test_restore_without_skip_fires_the_missed_slot_once() -> None:
    c = Clock(0)
    c.cron(name="m", repeatEvery=MINUTE, preventOverlap=False, skipMissedOnRestart=False)
    back = c.restarted(10 * MINUTE + 5 * SECOND)
    assert len(back.at(10 * MINUTE + 5 * SECOND)) == 1
    assert back.at(10 * MINUTE + 6 * SECOND) == []
    assert back.engine.cron.schedules["m"]["nextRun"] == 11 * MINUTE


def test_the_stored_schedule_matches_the_engine() -> None:
    c = Clock(0)
    c.cron(name="m", repeatEvery=SECOND, maxLimit=5, preventOverlap=False)
    c.run_until(3 * SECOND, SECOND)
    crons: dict[str, Any] = {}
    fold_mutations(c.muts, crons=crons)
    assert crons == c.engine.cron.schedules


# -- the job-level repeat option ---------------------------------------------------------------


def _run(c: Clock, queue: str = "q") -> str | None:
    """Pull and ACK the next due job of `queue`; its id, or None if none is due."""
    job = c.cmd(cmd="PULL", queue=queue)["job"]
    if job is None:
        return None
    assert c.cmd(cmd="ACK", id=job["id"])["ok"]
    return str(job["id"])


def test_repeat_every_chains_until_the_limit() -> None:
    c = Clock(0)
    first = c.cmd(cmd="PUSH", queue="q", data={"x": 1}, repeat={"every": 1000, "limit": 3})
    ran = [_run(c)]
    assert ran == [first["id"]]
    assert _run(c) is None  # the successor waits for its slot
    c.now = 1000
    ran.append(_run(c))
    c.now = 2000
    ran.append(_run(c))
    c.now = 10_000
    assert _run(c) is None  # three runs: the chain is over
    jobs = [c.cmd(cmd="GetJob", id=i)["job"] for i in ran]
    assert [j["data"] for j in jobs] == [{"x": 1}] * 3
    assert [j["repeat"].get("count", 0) for j in jobs] == [0, 1, 2]


def test_repeat_pattern_waits_for_the_next_slot_in_its_zone() -> None:
    tz = "Europe/Berlin"
    c = Clock(ms(2026, 1, 1, 10, 0, tz=tz) + 5 * SECOND)
    c.cmd(cmd="PUSH", queue="q", data={}, repeat={"pattern": "0 12 * * *", "tz": tz})
    _run(c)
    (nxt,) = [j for j in c.cmd(cmd="GetJobs", queue="q", state="delayed")["jobs"]]
    assert nxt["runAt"] == ms(2026, 1, 1, 12, 0, tz=tz)


def test_a_failed_run_does_not_repeat_and_custom_ids_are_not_inherited() -> None:
    c = Clock(0)
    c.cmd(cmd="PUSH", queue="q", data={}, jobId="only", repeat={"every": 10}, maxAttempts=1)
    job = c.cmd(cmd="PULL", queue="q")["job"]
    assert c.cmd(cmd="FAIL", id=job["id"], error="no")["ok"]
    c.now = 100
    assert _run(c) is None
    c.cmd(cmd="PUSH", queue="q", data={}, jobId="again", repeat={"every": 10})
    assert _run(c) == "again"
    c.now = 200
    nxt = _run(c)
    assert nxt is not None and nxt != "again"


@pytest.mark.parametrize(
    ("repeat", "error"),
    [
        ({"every": -5}, "repeat.every must be a positive number"),
        ({}, "repeat needs exactly one of every and pattern"),
        ({"pattern": "nope"}, "Invalid cron expression: nope"),
        ({"every": 5, "tz": "Nowhere/Zone"}, "Invalid timezone: Nowhere/Zone"),
        ("daily", "repeat must be an object"),
    ],
)
def test_bad_repeat_options_refuse_the_push(repeat: Any, error: str) -> None:
    c = Clock(0)
    assert c.cmd(cmd="PUSH", queue="q", data={}, repeat=repeat)["error"] == error
    batch = c.cmd(cmd="PUSHB", queue="q", jobs=[{"data": 1}, {"data": 2, "repeat": repeat}])
    assert batch["error"] == f"jobs[1]: {error}"
    assert c.waiting() == 0
