"""The shard clock: wall-clock milliseconds that can never jump (docs/runtime.md, "Time")."""

from __future__ import annotations

import time

__all__ = ["AnchoredClock"]


class AnchoredClock:
    """Wall-clock milliseconds, anchored once and then advanced by the monotonic clock.

    bunqueue's timestamps are wall clock, but a wall-clock jump (NTP step, manual change) must
    never make a delayed job run early or a lease lapse early, so only the anchor reads it.
    """

    def __init__(self) -> None:
        self._wall_ms = time.time() * 1000.0
        self._mono = time.monotonic()

    def now(self) -> int:
        """Milliseconds since the epoch, as of the anchor plus the monotonic time since."""
        return int(self._wall_ms + (time.monotonic() - self._mono) * 1000.0)
