"""The writer's idle timers as one deadline, checked with one compare a turn.

Four things act on the writer's own clock rather than on a message: the idle vacuum's step
(`_vacuum`), the memory give-back (`_giveback`), the recycle (`_recycle`) and, on
PostgreSQL, the look for a Drain's range a takeover brought (`_drain_pieces`). Asking each of
them every turn whether it is due (and arming the give-back's and the recycle's quiet windows
on every busy turn) cost the loop around a durable push a dozen Python calls. `IdleTimers`
keeps `at`, the earliest of their deadlines, worked out again only after it passed or when
something can have made one earlier: the first busy turn after the windows were checked
(`arm`), a commit (the vacuum's deadline, which the writer lowers `at` to), a Drain's piece.

`at` may be early, never late: every check is guarded by its own clock, so a turn that
reaches `at` early only finds nothing due and works `at` out anew.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from shardq.runtime._giveback import IdleGiveBack
from shardq.runtime.writer._drain_pieces import DrainPieces
from shardq.runtime.writer._recycle import WriterRecycle
from shardq.runtime.writer._vacuum import IdleVacuum

__all__ = ["IdleTimers"]


class IdleTimers:
    """`at`: when the writer next calls `turn` (math.inf: nothing armed, sleep without a
    timeout). `armed`: whether busy turns have armed the quiet windows since the last
    `turn`; the writer calls `arm(now)` on a busy turn while it is False."""

    __slots__ = ("_clock", "_give_back", "_pieces", "_recycle", "_vacuum", "armed", "at")

    def __init__(
        self,
        vacuum: IdleVacuum,
        give_back: IdleGiveBack,
        pieces: DrainPieces,
        recycle: WriterRecycle,
        clock: Callable[[], float],
    ) -> None:
        self._vacuum = vacuum
        self._give_back = give_back
        self._pieces = pieces
        self._recycle = recycle
        self._clock = clock
        self.armed = False
        self.at = self._earliest()

    def arm(self, now: float) -> None:
        """A turn handled a message at `now`: arm the quiet windows (if they are not)."""
        self._give_back.busy(now)
        self._recycle.busy(now)
        self.armed = True
        self.at = self._earliest()

    def turn(self, now: float, batch_waits: bool) -> int | None:
        """`at` has passed: a Drain look, a vacuum step (only while no batch waits), the
        give-back's check; the RSS in bytes if the writer should recycle now (else None).
        Works `at` out anew."""
        self._pieces.tick(now)
        vacuum = self._vacuum
        if not batch_waits and vacuum.due(now):
            vacuum.step()
            now = self._clock()
        self._give_back.check(now)
        rss = self._recycle.due(now)
        # A window `due` left armed stays so; `arm` again on the next busy turn is harmless.
        self.armed = False
        self.at = self._earliest()
        return rss

    def _earliest(self) -> float:
        at = math.inf
        for wait in (self._vacuum.deadline(), self._give_back.deadline(),
                     self._pieces.deadline(), self._recycle.deadline()):  # fmt: skip
            if wait is not None and wait < at:
                at = wait
        return at
