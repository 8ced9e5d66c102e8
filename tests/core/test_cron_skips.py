"""The two cron rules that skip a due slot (docs/protocol.md §15.4), on a fake clock:
`skipIfNoWorker` (the served queues are an input of the engine) and the 0.8-interval guard
against a fire that follows the last one too closely, across restarts and DST."""

from __future__ import annotations

import itertools
from datetime import datetime
from zoneinfo import ZoneInfo

from test_cron import HOUR, MINUTE, SECOND, Clock, ms


def test_no_worker_skips_each_slot_and_never_fires_it_later() -> None:
    c = Clock(0)
    c.cron(name="w", repeatEvery=SECOND, skipIfNoWorker=True, preventOverlap=False)
    assert c.run_until(5 * SECOND, SECOND) == []
    rec = c.engine.cron.schedules["w"]
    assert (rec["lastRun"], rec["nextRun"], rec["executions"]) == (5 * SECOND, 6 * SECOND, 0)
    c.engine.cron.workers.set_worker_queues(["other"])  # a worker of another queue does not count
    assert c.at(6 * SECOND) == []
    c.engine.cron.workers.set_worker_queues(["other", "q"])
    assert len(c.at(7 * SECOND)) == 1  # the next slot only: no backlog of the skipped ones
    assert c.run_until(10 * SECOND, SECOND) == [8 * SECOND, 9 * SECOND, 10 * SECOND]
    c.engine.cron.workers.set_worker_queues([])  # the worker left
    assert c.run_until(13 * SECOND, SECOND) == []
    assert c.waiting() == 4
    assert c.engine.cron.schedules["w"]["executions"] == 4


def test_a_pull_waiting_on_the_queue_counts_as_a_worker() -> None:
    c = Clock(0)
    c.cron(name="w", repeatEvery=SECOND, skipIfNoWorker=True, preventOverlap=False)
    waiting: set[str] = set()
    c.engine.cron.workers.pull_waiting = waiting.__contains__
    assert c.at(SECOND) == []
    waiting.add("q")
    assert len(c.at(2 * SECOND)) == 1
    waiting.clear()
    assert c.at(3 * SECOND) == []


def test_without_the_option_a_schedule_fires_with_no_worker() -> None:
    c = Clock(0)
    c.cron(name="w", repeatEvery=SECOND, preventOverlap=False)
    assert c.run_until(3 * SECOND, SECOND) == [SECOND, 2 * SECOND, 3 * SECOND]


def test_skipped_slots_do_not_count_toward_max_limit() -> None:
    c = Clock(0)
    c.cron(name="w", repeatEvery=SECOND, maxLimit=2, skipIfNoWorker=True, preventOverlap=False)
    assert c.run_until(3 * SECOND, SECOND) == []
    assert "w" in c.engine.cron.schedules
    c.engine.cron.workers.set_worker_queues(["q"])
    assert c.run_until(6 * SECOND, SECOND) == [4 * SECOND, 5 * SECOND]
    assert "w" not in c.engine.cron.schedules  # removed after its two jobs, not after two slots


def test_skipped_slots_stay_skipped_after_a_restart() -> None:
    c = Clock(0)
    c.cron(name="w", repeatEvery=SECOND, skipIfNoWorker=True, preventOverlap=False)
    c.run_until(3 * SECOND, SECOND)
    back = c.restarted(3 * SECOND)
    assert back.engine.cron.schedules["w"]["lastRun"] == 3 * SECOND
    assert back.at(3 * SECOND + 500) == []
    assert back.at(4 * SECOND) == []  # a restarted engine knows of no worker until told
    back.engine.cron.workers.set_worker_queues(["q"])
    assert back.run_until(6 * SECOND, SECOND) == [5 * SECOND, 6 * SECOND]
    assert back.waiting() == 2


# -- the 0.8-interval rule -------------------------------------------------------------------


def test_a_slot_right_after_a_late_fire_is_skipped() -> None:
    c = Clock(0)
    c.cron(name="m", repeatEvery=MINUTE, preventOverlap=False)
    assert len(c.at(MINUTE + 20 * SECOND)) == 1  # late by 20 s: fires, as before
    assert c.at(2 * MINUTE) == []  # 40 s after that fire, less than 0.8 of a minute
    assert c.engine.cron.schedules["m"]["lastRun"] == 2 * MINUTE  # handled: it never fires later
    assert len(c.at(3 * MINUTE)) == 1
    assert c.waiting() == 2


def test_a_late_fire_of_an_expression_skips_the_next_slot_too() -> None:
    c = Clock(ms(2026, 1, 1))
    c.cron(name="m", schedule="* * * * *", preventOverlap=False)
    assert len(c.at(ms(2026, 1, 1, 0, 1) + 50 * SECOND)) == 1
    assert c.at(ms(2026, 1, 1, 0, 2)) == []
    assert len(c.at(ms(2026, 1, 1, 0, 3))) == 1


def test_a_fire_at_the_edge_of_the_gap_still_happens() -> None:
    c = Clock(0)
    c.cron(name="m", repeatEvery=10 * SECOND, preventOverlap=False)
    assert len(c.at(12 * SECOND)) == 1
    assert len(c.at(20 * SECOND)) == 1  # exactly 0.8 of the interval after: not too soon


def test_on_time_slots_are_never_skipped() -> None:
    c = Clock(0)
    c.cron(name="s", repeatEvery=SECOND, preventOverlap=False)
    # Ticks that come up to 150 ms late, as a loaded shard's may, fire every slot.
    fired = [t for t in range(SECOND, 20 * SECOND + 1, SECOND) if c.at(t + (t // SECOND % 4) * 50)]
    assert len(fired) == 20


def test_a_restart_that_fires_a_missed_slot_late_skips_the_next_one() -> None:
    c = Clock(0)
    c.cron(name="m", repeatEvery=MINUTE, preventOverlap=False, skipMissedOnRestart=False)
    assert len(c.at(MINUTE)) == 1
    back = c.restarted(10 * MINUTE + 55 * SECOND)  # down for ten slots
    assert len(back.at(10 * MINUTE + 55 * SECOND)) == 1  # the missed slot fires once, late
    again = back.restarted(10 * MINUTE + 58 * SECOND)  # and the server restarts once more
    assert again.engine.cron.schedules["m"]["lastFiredAt"] == 10 * MINUTE + 55 * SECOND
    assert again.at(11 * MINUTE) == []  # 5 s after that fire: the guard holds across restarts
    assert len(again.at(12 * MINUTE)) == 1
    assert again.waiting() == 3


def test_replacing_a_schedule_keeps_its_last_fire() -> None:
    c = Clock(0)
    c.cron(name="m", repeatEvery=MINUTE, preventOverlap=False)
    c.at(MINUTE + 50 * SECOND)
    c.now = MINUTE + 55 * SECOND
    made = c.cron(name="m", schedule="* * * * *", preventOverlap=False)["cron"]
    assert "lastFiredAt" not in made  # bookkeeping, not part of the schedule on the wire
    assert made["nextRun"] == 2 * MINUTE
    assert c.at(2 * MINUTE) == []  # 10 s after the last fire of the schedule it replaced
    assert len(c.at(3 * MINUTE)) == 1


def test_spring_forward_keeps_every_slot_of_an_hourly_expression() -> None:
    tz = "America/New_York"
    c = Clock(ms(2026, 3, 8, 0, 0, tz=tz))
    c.cron(name="h", schedule="30 * * * *", timezone=tz, preventOverlap=False)
    fired = c.run_until(c.now + 4 * HOUR, MINUTE)
    walls = [datetime.fromtimestamp(t / 1000, ZoneInfo(tz)).strftime("%H:%M") for t in fired]
    # 02:30 does not exist and fires at 03:00; 03:30 comes 30 min later, a full interval
    # of the expression there, so the guard does not drop it.
    assert walls == ["00:30", "01:30", "03:00", "03:30", "04:30"]


def test_fall_back_hour_fires_each_wall_time_once_with_the_guard() -> None:
    tz = "Europe/Berlin"
    c = Clock(ms(2026, 10, 25, 1, 0, tz=tz))
    c.cron(name="q", schedule="*/30 * * * *", timezone=tz, preventOverlap=False)
    fired = c.run_until(ms(2026, 10, 25, 4, 0, tz=tz), MINUTE)
    walls = [datetime.fromtimestamp(t / 1000, ZoneInfo(tz)).strftime("%H:%M") for t in fired]
    assert walls == ["01:30", "02:00", "02:30", "03:00", "03:30", "04:00"]
    gaps = {b - a for a, b in itertools.pairwise(fired)}
    assert min(gaps) >= 30 * MINUTE
