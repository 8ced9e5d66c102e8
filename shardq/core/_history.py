"""Per-queue, per-minute history for the dashboard's charts (docs/http.md, "Dashboard history").

`FinishedLog` keeps two weeks of finished-job counts, the shape bunqueue's queue-scoped
`Metrics` answers. The charts want more, for a shorter time: jobs pushed, completed and failed
for good per minute, and how long the completed ones waited (due to picked up) and ran (picked
up to completed), as counts per `TIME_BOUNDS_MS` bucket so that minutes and queues add up and
percentiles come out of the sum. Only the last `max_history_minutes` minutes are kept, and a
minute costs nothing until something happens in it: about 700 bytes per queue and
minute (two bucket lists and three counters), 42 KB per busy queue for the default hour.

A push pays one dict lookup and an addition; a completion two bisects per job. A restart
rebuilds the completed and failed counts and times from the jobs the shard still holds (they
pass through the same place), not the pushes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, Final

from ._job import Job

__all__ = ["MINUTE_MS", "TIME_BOUNDS_MS", "QueueHistory"]

MINUTE_MS: Final = 60_000
# Upper bounds (ms) of the wait and run time buckets, the last one +Inf: from a job picked
# up at once to one that waited half an hour, about two buckets per factor of five.
TIME_BOUNDS_MS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000,
                         30_000, 60_000, 300_000, 1_800_000)  # fmt: skip
_BUCKETS: Final = len(TIME_BOUNDS_MS) + 1


class _Minute:
    __slots__ = ("completed", "failed", "pushed", "run", "wait")

    def __init__(self) -> None:
        self.pushed = 0
        self.completed = 0
        self.failed = 0
        self.wait: list[int] | None = None  # made at the minute's first timed completion
        self.run: list[int] | None = None


class QueueHistory:
    """The last minutes of one queue; `keep` (max_history_minutes) bounds how many."""

    __slots__ = ("_last", "_last_entry", "_minutes")

    def __init__(self) -> None:
        self._minutes: dict[int, _Minute] = {}
        # The minute used last: nearly every call is for it. Pruning happens only when a new
        # minute begins, which becomes the last one, so the cached entry is never a pruned one.
        self._last = -1
        self._last_entry = _Minute()

    def _minute(self, at: int, keep: int) -> _Minute:
        minute = at // MINUTE_MS
        if minute == self._last:
            return self._last_entry
        entry = self._minutes.get(minute)
        if entry is None:
            entry = self._minutes[minute] = _Minute()
            if len(self._minutes) > keep:  # only when a minute begins: O(keep) then, O(1) else
                cutoff = max(self._minutes) - keep
                for old in [m for m in self._minutes if m <= cutoff]:
                    del self._minutes[old]
        self._last, self._last_entry = minute, entry
        return entry

    def pushed(self, count: int, at: int, keep: int) -> None:
        if at // MINUTE_MS == self._last:  # `_minute`'s first test, inline: once per push
            self._last_entry.pushed += count
        else:
            self._minute(at, keep).pushed += count

    def failed(self, count: int, at: int, keep: int) -> None:
        self._minute(at, keep).failed += count

    def completed(self, jobs: Sequence[Job], at: int, keep: int) -> None:
        entry = self._last_entry if at // MINUTE_MS == self._last else self._minute(at, keep)
        entry.completed += len(jobs)
        wait, run = entry.wait, entry.run
        if wait is None or run is None:
            wait = entry.wait = [0] * _BUCKETS
            run = entry.run = [0] * _BUCKETS
        # Per job, so bucketed by runs: jobs pulled together share their run time, and jobs
        # pushed together their wait, so a batch bisects about once per run, not per job.
        last_wait = last_run = -1  # a start value whose bucket (the first) is right anyway
        wait_bucket = run_bucket = waits = runs = 0
        for job in jobs:
            started, done = job.started_at, job.completed_at
            if started is None or done is None:
                continue  # finished without being picked up (a flow parent, a forced move)
            # A negative time (a clock step back) lands in the first bucket, as 0 would.
            waited, ran = started - job.run_at, done - started
            if waited != last_wait:
                wait[wait_bucket] += waits
                last_wait, wait_bucket, waits = waited, bisect_left(TIME_BOUNDS_MS, waited), 0
            waits += 1
            if ran != last_run:
                run[run_bucket] += runs
                last_run, run_bucket, runs = ran, bisect_left(TIME_BOUNDS_MS, ran), 0
            runs += 1
        wait[wait_bucket] += waits
        run[run_bucket] += runs

    def read(self, now: int, minutes: int) -> list[list[Any]]:
        """`[minuteStartMs, pushed, completed, failed, waitCounts, runCounts]` for each minute
        with activity among the last `minutes` up to `now`, oldest first (counts may be None)."""
        newest = now // MINUTE_MS
        rows = []
        for minute in sorted(m for m in self._minutes if newest - minutes < m <= newest):
            e = self._minutes[minute]
            wait = list(e.wait) if e.wait is not None else None
            run = list(e.run) if e.run is not None else None
            rows.append([minute * MINUTE_MS, e.pushed, e.completed, e.failed, wait, run])
        return rows
