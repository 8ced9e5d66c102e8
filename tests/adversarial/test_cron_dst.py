"""Weeks of uptime, cron part: 1,000 cron ticks across DST at engine level, on a fake clock.

The engine is driven the way a shard drives it: sleep until `next_deadline()`, then `tick` at
that instant. Two zones (Europe/Berlin and America/New_York), each across its spring-forward
and its fall-back, with an hourly schedule at :30 and daily ones at 02:30 (inside Berlin's
skipped and repeated hour) and 01:30 (inside New York's). The slots expected are computed
here from `zoneinfo` alone, from the rules of docs/protocol.md §15.3, not with the engine's
cron library: a skipped wall time fires at the first valid instant after it, a repeated one
fires once (its first occurrence). Every tick must fire exactly the slot expected, at that
instant (no drift), once (no double fire), and no expected slot may be missing.

`SHARDQ_ADVERSARIAL_CRON_TICKS` raises the number of hourly ticks per transition
(default 226: with the 24 daily slots, 250 per transition and 1,000 in all).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from shardq.core import Engine

HOURLY_TICKS = int(os.environ.get("SHARDQ_ADVERSARIAL_CRON_TICKS", "226"))
DAYS = 12  # daily slots per transition: the transition day in the middle
MINUTE = timedelta(minutes=1)

# (zone, spring-forward day, fall-back day) in 2026.
TRANSITIONS = [
    ("Europe/Berlin", datetime(2026, 3, 29), datetime(2026, 10, 25)),
    ("America/New_York", datetime(2026, 3, 8), datetime(2026, 11, 1)),
]


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def instant(local: datetime, zone: ZoneInfo) -> int:
    """The epoch ms a cron slot at naive wall time `local` stands for (§15.3): a wall time
    the zone skips becomes the first valid instant after it; a repeated one its first."""
    for _ in range(24 * 60):
        aware = local.replace(tzinfo=zone, fold=0)
        if aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == local:
            return ms(aware)
        local += MINUTE
    raise AssertionError(f"no valid wall time after {local} in {zone}")


def expected(start: datetime, step: timedelta, count: int, zone: ZoneInfo) -> list[int]:
    """The slots of a schedule whose wall times are start, start + step, ... (naive)."""
    return sorted({instant(start + i * step, zone) for i in range(count)})


def schedules(zone: str, day: datetime) -> Iterator[tuple[str, str, list[int]]]:
    """(name, expression, expected slots) for one transition day of one zone."""
    z = ZoneInfo(zone)
    first_hour = day - timedelta(hours=HOURLY_TICKS // 2)
    yield "hourly", "30 * * * *", expected(first_hour.replace(minute=30), timedelta(hours=1),
                                           HOURLY_TICKS, z)  # fmt: skip
    first_day = day - timedelta(days=DAYS // 2)
    for hour in (1, 2):
        at = first_day.replace(hour=hour, minute=30)
        yield f"daily-{hour}", f"30 {hour} * * *", expected(at, timedelta(days=1), DAYS, z)


def ok(engine: Engine, now: int, **cmd: Any) -> dict[str, Any]:
    reply = engine.apply(cmd, now).reply
    assert reply.get("ok") is True, (cmd, reply)
    return reply


def run(zone: str, day: datetime) -> dict[str, list[tuple[int, int]]]:
    """Drive an engine through the window; (tick instant, job slot) of every job per schedule."""
    engine = Engine()
    plans = {name: (expr, slots) for name, expr, slots in schedules(zone, day)}
    start = min(slots[0] for _, slots in plans.values()) - 60_000
    end = max(slots[-1] for _, slots in plans.values())
    for name, (expr, _) in plans.items():
        ok(engine, start, cmd="Cron", name=name, queue=name, data=None, schedule=expr,
           timezone=zone, preventOverlap=False)  # fmt: skip
    fired: dict[str, list[tuple[int, int]]] = {name: [] for name in plans}
    now, ticks = start, 0
    while ticks < 10 * HOURLY_TICKS:  # bounded: far more turns than slots
        deadline = engine.next_deadline()
        assert deadline is not None and deadline >= now, (deadline, now)
        if deadline > end:
            break
        now = deadline
        engine.tick(now)
        ticks += 1
        for name in plans:
            got = ok(engine, now, cmd="PULLB", queue=name, count=10, owner="w")
            fired[name] += [(now, int(job["createdAt"])) for job in got["jobs"]]
            if got["jobs"]:  # done, so no lease lapses into a second delivery later
                ids = [job["id"] for job in got["jobs"]]
                ok(engine, now, cmd="ACKB", ids=ids, tokens=got["tokens"])
    return fired


@pytest.mark.parametrize("zone,spring,fall", TRANSITIONS, ids=[t[0] for t in TRANSITIONS])
@pytest.mark.parametrize("which", ["spring-forward", "fall-back"])
def test_cron_ticks_across_dst_fire_every_slot_once_on_time(
    zone: str, spring: datetime, fall: datetime, which: str
) -> None:
    day = spring if which == "spring-forward" else fall
    fired = run(zone, day)
    total = 0
    for name, _, want in schedules(zone, day):
        got = fired[name]
        all_slots = [slot for _, slot in got]
        assert len(set(all_slots)) == len(all_slots), f"{zone} {name}: a slot fired twice"
        drift = [(t, s) for t, s in got if t != s]
        assert not drift, f"{zone} {name}: fired off its slot: {drift[:3]}"
        # All schedules start together; each is judged over its own window.
        slots = [s for s in all_slots if want[0] <= s <= want[-1]]
        assert slots == want, f"{zone} {name}: missing {sorted(set(want) - set(slots))[:3]}, "\
            f"unexpected {sorted(set(slots) - set(want))[:3]}"  # fmt: skip
        total += len(slots)
    print(f"{zone} {which}: {total} cron ticks checked")


def test_the_expected_slots_follow_the_documented_dst_rules() -> None:
    """The reference itself, on the cases §15.3 names: Berlin's 02:30 on spring-forward day
    becomes 03:00 CEST; New York's 01:30 on fall-back day fires at its first occurrence."""
    berlin, new_york = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")
    assert instant(datetime(2026, 3, 29, 2, 30), berlin) == ms(
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    )
    assert instant(datetime(2026, 11, 1, 1, 30), new_york) == ms(
        datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT (UTC-4), not 01:30 EST
    )
    hourly = expected(datetime(2026, 11, 1, 0, 30), timedelta(hours=1), 3, new_york)
    assert [datetime.fromtimestamp(s / 1000, UTC).hour for s in hourly] == [4, 5, 7]
