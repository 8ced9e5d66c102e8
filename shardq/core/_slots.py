"""The next slot of a schedule: epoch milliseconds in, epoch milliseconds out.

The one core module that uses `datetime` (tests/core/test_purity.py allows it here): a cron
expression is read in a time zone's wall-clock time, so slots are computed through aware
datetimes. It never reads a clock: every instant is derived from the `after` passed in. Zone
rules come from the system's tz database through `zoneinfo` (read once, then cached).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from shardq.errors import CommandError

__all__ = ["check_zone", "next_slot"]

# croniter yields candidates in order; only the hour repeated by a fall-back skips any (at
# most 3600 for a 6-field every-second expression), so this bound is never reached in practice.
_MAX_CANDIDATES: Final = 10_000
# The longest a zone ever skipped: a whole day (Samoa, 30 December 2011).
_MAX_GAP_MINUTES: Final = 24 * 60


def _zone(name: object) -> tzinfo:
    return UTC if name is None else ZoneInfo(str(name))


def check_zone(name: object) -> bool:
    """Whether `name` is an IANA time zone this machine knows."""
    try:
        _zone(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _wall(ms: int, zone: tzinfo) -> datetime:
    return datetime.fromtimestamp(ms / 1000, zone).replace(tzinfo=None)


def _exists(local: datetime, zone: tzinfo) -> bool:
    aware = local.replace(tzinfo=zone)
    return aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == local


def _instants(local: datetime, zone: tzinfo) -> tuple[int, ...]:
    """The epoch ms a wall time stands for: its first occurrence, then its second where the
    clock falls back; for a wall time spring-forward skips, the first valid instant after it
    (the skipped hour's slots fire as the hour ends, so none is lost)."""
    if not _exists(local, zone):
        step = timedelta(minutes=1)  # zone transitions fall on whole minutes
        local = local.replace(second=0, microsecond=0)
        for _ in range(_MAX_GAP_MINUTES):
            local += step
            if _exists(local, zone):
                break
    first = int(local.replace(tzinfo=zone, fold=0).timestamp() * 1000)
    second = int(local.replace(tzinfo=zone, fold=1).timestamp() * 1000)
    return (first,) if second <= first else (first, second)


def next_slot(rec: Mapping[str, Any], after: int) -> int:
    """The first slot of schedule `rec` strictly after `after` (ms).

    `repeatEvery` slots lie on a grid from `anchor`. Cron slots are the expression's wall
    times in the schedule's zone (docs/protocol.md §15.3), and the wall time moves forward
    past the slot last handled (`lastRun`): when the clock falls back, the repeated hour's
    wall times (already fired once) are skipped, so a daily 01:30 fires once. croniter walks
    naive wall times here because, given an aware start, it drops a slot that spring-forward
    skips when the expression matches other hours too (an hourly :30 went from 01:30 to 03:30).
    """
    every = rec.get("repeatEvery")
    if every:
        anchor, every = int(rec["anchor"]), int(every)
        if after < anchor:
            return anchor
        return anchor + ((after - anchor) // every + 1) * every
    expr = str(rec["schedule"])
    zone = _zone(rec.get("timezone"))
    last = rec.get("lastRun")
    floor = _wall(int(last), zone) if last is not None else None
    start = _wall(after, zone)
    if floor is not None and floor > start:
        start = floor  # a backward clock: no wall time before the last slot fires again
    it = croniter(expr, start, second_at_beginning=len(expr.split()) == 6)
    try:
        for _ in range(_MAX_CANDIDATES):
            for ms in _instants(it.get_next(datetime), zone):
                if ms > after:
                    return ms
    except (CroniterError, ValueError, OverflowError):
        pass  # a valid expression that matches no date (30 February), or past year 9999
    raise CommandError(f"Cron expression has no future slot: {expr}")
