"""A recovering shard's progress: records loaded, told to the supervisor and to the log.

A shard that loads a large backlog at start (or a takeover's partitions while serving) counts
the records as they stream from the store into the engine, and reports the count often enough
that the supervisor never takes a shard at work for a stalled one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import structlog

from shardq.core import Record
from shardq.runtime._child import SupervisorLink

__all__ = ["LOG_PROGRESS_EVERY_S", "PROGRESS_EVERY_S", "LoadStopped", "Progress"]

# A recovering shard tells the supervisor how far it got this often: well inside the shortest
# `ready_timeout_ms` (1 s), so a shard at work is never taken for a stalled one.
PROGRESS_EVERY_S = 0.25
# ... and logs it this often (a 30 s recovery logs 15 lines).
LOG_PROGRESS_EVERY_S = 2.0
# Records loaded between two looks at the clock: a clock read per record would cost more.
_CLOCK_EVERY = 1000

_log = structlog.get_logger()


class LoadStopped(Exception):
    """A stop came while a starting shard loaded: the load ends where it was (`Progress`)."""


class Progress:
    """Counts the records a recovery loads and reports the count: to the supervisor (which
    waits on a child that makes progress) every `PROGRESS_EVERY_S`, to the log every
    `LOG_PROGRESS_EVERY_S`.

    With `stopping` (a starting shard's "has SIGTERM come?"), asked at each report and at
    each step's end, the load raises `LoadStopped` at the next record or step once it says
    yes: a stop then waits at most one report period, plus a statement that returns no row
    meanwhile, instead of the whole load.
    """

    def __init__(
        self, sup: SupervisorLink | None, stopping: Callable[[], bool] | None = None
    ) -> None:
        # None: a load while serving (a gained partition), shown in the log only, every
        # second, as the supervisor has nothing to wait for then.
        self._sup = sup
        self._stopping = stopping
        self.stopped = False  # `stopping` said yes
        self._log_every = LOG_PROGRESS_EVERY_S if sup is not None else 1.0
        self.loaded = 0
        self._started = time.monotonic()
        self._next = self._started + PROGRESS_EVERY_S
        self._next_log = self._started + self._log_every
        # The load's steps so far and the milliseconds each took (`mark`), for the log.
        self.steps: dict[str, int] = {}
        self._step_at = self._started

    def mark(self, step: str) -> None:
        """`step` of the load just ended: note its time and tell the supervisor."""
        now = time.monotonic()
        self.steps[step] = round((now - self._step_at) * 1000)
        self._step_at = now
        self.beat()
        if self.stopped or (self._stopping is not None and self._stopping()):
            self.stopped = True
            raise LoadStopped(step)

    def beat(self) -> None:
        """Tell the supervisor the load goes on (between its first statements)."""
        if self._sup is not None:
            self._sup.progress(loaded=self.loaded)

    def tick(self) -> None:
        """Report if `PROGRESS_EVERY_S` has passed since the last report: cheap enough to be
        called from inside a long store statement (`Storage.set_progress`)."""
        if time.monotonic() >= self._next:
            self._report(self.loaded)

    def count(self, records: Iterator[Record]) -> Iterator[Record]:
        loaded = self.loaded
        for rec in records:
            loaded += 1
            if not loaded % _CLOCK_EVERY:
                # What `tick` reports from inside the store's statement that reads the next
                # records: without it, the count this load started at (a progress line said
                # 0 loaded between 37,000 and 88,000).
                self.loaded = loaded - 1
                if time.monotonic() >= self._next:
                    self._report(loaded)
                if self.stopped:
                    self.loaded = loaded - 1  # this record was not handed on
                    raise LoadStopped("records")
            yield rec
        self.loaded = loaded

    def _report(self, loaded: int) -> None:
        now = time.monotonic()
        self._next = now + PROGRESS_EVERY_S
        if self._sup is not None:
            self._sup.progress(loaded=loaded)
        if self._stopping is not None and self._stopping():
            # Raised by `count` or `mark`, not here: `tick` runs inside a store statement,
            # whose progress hook swallows what it raises.
            self.stopped = True
        if now >= self._next_log:
            self._next_log = now + self._log_every
            rate = loaded / max(now - self._started, 1e-9)
            after = next(reversed(self.steps), None)  # the step under way follows this one
            _log.info("shard recovering", loaded=loaded, jobs_per_s=round(rate), after=after)
