"""The server's clocks (docs/runtime.md, "Time").

`wall()` is the one source of wall-clock seconds for every server process: `time.time` itself,
unless the test-only setting `test_clock_file` names a file holding an offset, in seconds, to
add to it (how `tests/adversarial/test_clock_jumps.py` moves the clock hours forward and back
without touching the machine's). Callers read it as `_clock.wall()`, so the one installed when
a child reads its spec (`install_test_clock`) is the one they get.

`AnchoredClock` is what job time is measured with: wall-clock milliseconds that never jump.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["AnchoredClock", "TestClockError", "install_test_clock", "wall"]

WallClock = Callable[[], float]

# Off (the production path): the plain function, no indirection.
wall: WallClock = time.time


class TestClockError(ValueError):
    """The test clock file does not hold a number of seconds."""


class _OffsetClock:
    """`time.time()` plus the offset the file holds now (a missing or empty file: 0)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def offset(self) -> float:
        try:
            text = self._path.read_text().strip()
        except FileNotFoundError:
            return 0.0
        try:
            return float(text) if text else 0.0
        except ValueError:
            raise TestClockError(
                f"test_clock_file {self._path} must hold a number of seconds, got {text[:40]!r}"
            ) from None

    def __call__(self) -> float:
        return time.time() + self.offset()


def install_test_clock(path: str) -> None:
    """Make `wall()` read `path`'s offset ("" keeps `time.time`). Test-only: see the module.

    Raises `TestClockError` at once if the file holds something else than a number.
    """
    global wall
    if not path:
        wall = time.time
        return
    clock = _OffsetClock(Path(path))
    clock.offset()
    wall = clock


class AnchoredClock:
    """Wall-clock milliseconds, anchored once and then advanced by the monotonic clock.

    bunqueue's timestamps are wall clock, but a wall-clock jump (NTP step, manual change) must
    never make a delayed job run early or a lease lapse early, so only the anchor reads it.
    """

    def __init__(self) -> None:
        self._wall_ms = wall() * 1000.0
        self._mono = time.monotonic()

    def now(self) -> int:
        """Milliseconds since the epoch, as of the anchor plus the monotonic time since."""
        return int(self._wall_ms + (time.monotonic() - self._mono) * 1000.0)

    def at(self, mono: float) -> int:
        """`now()` as of `mono`, a `time.monotonic()` the caller read: one read of the clock
        serves a turn's every use."""
        return int(self._wall_ms + (mono - self._mono) * 1000.0)
