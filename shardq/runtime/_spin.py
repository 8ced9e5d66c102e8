"""Busy-polling before sleeping: the `spin_us` setting (docs/runtime.md, "Spinning").

A process that sleeps in `epoll`/`poll` and is woken by its peer pays a wake-up; on a small VM
an idle vCPU takes tens of microseconds to wake, and a queue command crosses three processes.
With `spin_us` > 0 the front end and the shards keep polling without sleeping for up to that
long before they sleep, yielding the CPU (`sched_yield`) between polls so that any other
runnable process goes first. A request that comes within the window finds its process awake.
An idle server still goes silent, but under a steady trickle of requests the spinning
processes stay busy.

`spin_us = "auto"` spins adaptively (`AdaptiveSpin`): only while the messages keep coming
closer together than `spin_auto_max_us`, the gap under which a sleeping process would be woken
again so soon that the wake-up is the larger cost. Anything sparser, a trickle or an idle
server, sleeps at once.
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

__all__ = [
    "AUTO",
    "MAX_SPIN_US",
    "AdaptiveSpin",
    "FixedSpin",
    "SpinPolicy",
    "SpinningSelector",
    "spin_policy",
    "spin_until",
]

MAX_SPIN_US = 10_000  # 10 ms: beyond that, spinning is just a busy server
AUTO = "auto"
# How many of the last gaps `AdaptiveSpin` remembers, and how many of them must be short for
# it to spin: one slow round trip (a p99 outlier) does not stop it, a trickle with every
# other gap long (request, then reply of the next process) never starts it.
HISTORY = 8
SHORT_NEEDED = 6
T = TypeVar("T")


class SpinPolicy(Protocol):
    """How long a process spins before it sleeps; told when a wait ends with something."""

    def window(self, now: float) -> float:
        """Seconds to keep polling, from `now` (a `time.perf_counter()`), before sleeping."""
        ...

    def note(self, now: float) -> None:
        """A wait ended at `now` with something to do (a message, a writable socket)."""
        ...


class FixedSpin:
    """`spin_us = N`: always spin N microseconds before sleeping."""

    __slots__ = ("_spin_s",)

    def __init__(self, spin_s: float) -> None:
        self._spin_s = spin_s

    def window(self, now: float) -> float:
        return self._spin_s

    def note(self, now: float) -> None:
        pass


class AdaptiveSpin:
    """`spin_us = "auto"`: spin only while the gaps between arrivals stay short.

    It keeps, in a ring of `history` flags, whether each of the last gaps between two noted
    arrivals was at most `max_gap_s`. While at least `short_needed` of them were, it spins
    until `max_gap_s` after the last arrival, so a message that keeps the rhythm finds the
    process awake; otherwise, and once that time has passed, the window is 0 and the process
    sleeps at once. Memory is the ring, whatever the traffic. Pure: time comes in as `now`.
    """

    __slots__ = ("_at", "_last", "_max_gap", "_need", "_ring", "_short")

    def __init__(
        self, max_gap_s: float, history: int = HISTORY, short_needed: int = SHORT_NEEDED
    ) -> None:
        if max_gap_s <= 0 or not 1 <= short_needed <= history:
            raise ValueError("need max_gap_s > 0 and 1 <= short_needed <= history")
        self._max_gap = max_gap_s
        self._need = short_needed
        self._ring = [False] * history  # a fresh process has seen no short gap: it sleeps
        self._at = 0
        self._short = 0  # how many flags in the ring are True
        self._last: float | None = None

    def note(self, now: float) -> None:
        last, self._last = self._last, now
        if last is None:
            return
        short = now - last <= self._max_gap
        at = self._at
        self._short += short - self._ring[at]
        self._ring[at] = short
        self._at = (at + 1) % len(self._ring)

    def window(self, now: float) -> float:
        if self._last is None or self._short < self._need:
            return 0.0
        return max(0.0, self._last + self._max_gap - now)

    @property
    def short_gaps(self) -> int:
        """How many of the remembered gaps were short (for tests and logs)."""
        return self._short


def spin_policy(spin_us: int | str, auto_max_us: int) -> SpinPolicy | None:
    """The policy for the `spin_us` setting: None for 0 (never spin)."""
    if spin_us == AUTO:
        return AdaptiveSpin(auto_max_us / 1e6)
    if isinstance(spin_us, int) and spin_us > 0:
        return FixedSpin(spin_us / 1e6)
    if spin_us == 0:
        return None
    raise ValueError(f'spin_us must be "auto" or 0 to {MAX_SPIN_US}, got {spin_us!r}')


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
    """An epoll selector for asyncio that spins as `policy` says before a blocking select.

    Only selects that would block count as arrivals: asyncio's zero-timeout selects, made
    while it has callbacks to run, are left as cheap as they were.
    """

    def __init__(self, policy: SpinPolicy) -> None:
        super().__init__()
        self._policy = policy

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0:
            return super().select(timeout)
        policy = self._policy
        spin_s = policy.window(time.perf_counter())
        got = spin_until(lambda: super(SpinningSelector, self).select(0), spin_s) if spin_s else []
        if not got:
            got = super().select(timeout)
        if got:
            policy.note(time.perf_counter())
        return got
