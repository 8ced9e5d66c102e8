"""What the garbage collector costs a process: passes and seconds per generation.

`GcClock.install()` adds a `gc.callbacks` hook (two `perf_counter` reads per collection, none
between collections); `fields()` are the numbers for the process's stop log line. The front end
logs them: with them one can tell whether its collections matter (they did not: 2 or 3 young
passes and no full one in 40,000 jobs of push -> pull -> ack, below a millisecond in all, so
its start-up heap is not frozen as a shard's is; bench/results/2026-12-05-s12-fe-delay.md).
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["GcClock"]


class GcClock:
    """Collections by generation (0, 1, 2) and the seconds they took, since `install`."""

    __slots__ = ("_started", "passes", "seconds")

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def install(self) -> GcClock:
        if self._on not in gc.callbacks:
            gc.callbacks.append(self._on)
        return self

    def uninstall(self) -> None:
        if self._on in gc.callbacks:
            gc.callbacks.remove(self._on)

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self.passes[generation] += 1
        self.seconds[generation] += time.perf_counter() - self._started

    def fields(self) -> dict[str, Any]:
        return {
            "gc_passes": list(self.passes),
            "gc_ms": [round(s * 1000, 1) for s in self.seconds],
            "gc_frozen": gc.get_freeze_count(),
        }
