"""Busy-polling before sleeping: the `spin_us` setting (docs/runtime.md, "Spinning").

A process that sleeps in `epoll`/`poll` and is woken by its peer pays a wake-up; on a small VM
an idle vCPU takes tens of microseconds to wake, and a queue command crosses three processes.
With `spin_us` > 0 the front end and the shards keep polling without sleeping for up to that
long after their last message, yielding the CPU (`sched_yield`) between polls so that any
other runnable process goes first. A request that comes within the window finds its process
awake. An idle server still goes silent: each process sleeps once `spin_us` passes with
nothing to do. The price is CPU: under a steady trickle of requests the spinning processes
stay busy.
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["MAX_SPIN_US", "SpinningSelector", "spin_until"]

MAX_SPIN_US = 10_000  # 10 ms: beyond that, spinning is just a busy server
T = TypeVar("T")


def spin_until(poll_now: Callable[[], list[T]], spin_s: float) -> list[T]:
    """Call `poll_now` (a zero-timeout poll) until it returns something or `spin_s` passes.

    Returns its last result, empty if the window passed with nothing.
    """
    end = time.perf_counter() + spin_s
    while True:
        got = poll_now()
        if got or time.perf_counter() >= end:
            return got
        os.sched_yield()


class SpinningSelector(selectors.EpollSelector):
    """An epoll selector for asyncio that spins `spin_s` before a blocking select."""

    def __init__(self, spin_s: float) -> None:
        super().__init__()
        self._spin_s = spin_s

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0:
            return super().select(timeout)
        got = spin_until(lambda: super(SpinningSelector, self).select(0), self._spin_s)
        return got or super().select(timeout)
