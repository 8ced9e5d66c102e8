"""The next slot of a schedule: epoch milliseconds in, epoch milliseconds out.

The one core module that uses `datetime` (tests/core/test_purity.py allows it here): a cron
expression is read in a time zone's wall-clock time, so slots are computed through aware
datetimes. It never reads a clock: every instant is derived from the `after` passed in. Zone
rules come from the system's tz database through `zoneinfo` (read once, then cached).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from shardq.errors import CommandError

__all__ = ["check_zone", "next_slot"]

# croniter yields candidates in order; only the hour repeated by a fall-back skips any (at
# most 3600 for a 6-field every-second expression), so this bound is never reached in practice.
_MAX_CANDIDATES: Final = 10_000


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


def next_slot(rec: Mapping[str, Any], after: int) -> int:
    """The first slot of schedule `rec` strictly after `after` (ms).

    `repeatEvery` slots lie on a grid from `anchor`. Cron slots also keep the local wall time
    moving forward past the slot last handled (`lastRun`): when the clock falls back, the
    repeated hour's wall times (already fired once) are skipped, so a daily 01:30 fires once.
    A wall time that spring-forward skips resolves to croniter's next valid instant.
    """
    every = rec.get("repeatEvery")
    if every:
        anchor, every = int(rec["anchor"]), int(every)
        if after < anchor:
            return anchor
        return anchor + ((after - anchor) // every + 1) * every
    expr = str(rec["schedule"])
    zone = _zone(rec.get("timezone"))
    it = croniter(
        expr,
        datetime.fromtimestamp(after / 1000, zone),
        second_at_beginning=len(expr.split()) == 6,
    )
    last = rec.get("lastRun")
    floor = _wall(int(last), zone) if last is not None else None
    try:
        for _ in range(_MAX_CANDIDATES):
            when = it.get_next(datetime)
            ms = int(when.timestamp() * 1000)
            if ms > after and (floor is None or when.replace(tzinfo=None) > floor):
                return ms
    except (CroniterError, ValueError, OverflowError):
        pass  # a valid expression that matches no date (30 February), or past year 9999
    raise CommandError(f"Cron expression has no future slot: {expr}")
