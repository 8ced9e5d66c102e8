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
server, sleeps at once. It also sleeps at once while the machine has no idle CPU
(`RunnableProbe`): a spin then takes a core from a process that has work, perhaps the very
peer it waits for, and the wake-up it saves is no longer the larger cost.
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
    "STATS",
    "AdaptiveSpin",
    "CommitSpin",
    "FixedSpin",
    "RunnableProbe",
    "SpinPolicy",
    "SpinStats",
    "SpinningSelector",
    "auto_spin",
    "spin_policy",
    "spin_until",
]

MAX_SPIN_US = 10_000  # 10 ms: beyond that, spinning is just a busy server
AUTO = "auto"
# How many of the last gaps between messages `AdaptiveSpin` averages: a few round trips of
# one request in flight, so that it follows a change of pace within a few requests.
HISTORY = 8
# A gap counts as at most this many `spin_auto_max_us`: one stall among quick round trips
# leaves the mean under the limit, while a trickle whose every other gap is long stays above.
OUTLIER_GAPS = 4
# A turn of `auto`'s spin (a zero-timeout poll and a `sched_yield`) takes a few microseconds;
# one that took longer than this had its CPU taken by another task, and the spin stops: a
# process that sleeps is woken with priority when its message comes, one that yielded waits
# its turn behind whatever took the CPU. The default of `spin_auto_cut_us`.
CUT_S = 50e-6
# How many such long turns end a spin (`spin_auto_cut_turns`' default). One is most often a
# round trip's own peer: on 2 CPUs the client (or the shard) runs its burst on the spinning
# process's core and then blocks on the very request the spin waits for; cutting there made
# the writer sleep through every durable batch of a client with 50 µs of Python per push
# (shardq's own: 297 against 227 µs per push, bench/results/2026-12-05-s12-durable-single.md).
# The turn is spared only if the machine check (`crowded`) still finds an idle CPU after it; a
# second long turn in the same spin is a busy CPU, and the spin ends.
CUT_TURNS = 2
T = TypeVar("T")


class SpinStats:
    """What this process's spinning did, for its stop log line: spins started, spins that ended
    with something to do, seconds spent spinning, spins `auto` skipped for a busy machine, and
    spins it cut short because another task took the CPU (`spin_until`), and of the spins
    those a shard made through a commit its reply waited on (`CommitSpin`)."""

    __slots__ = ("commit", "crowded", "cut", "hits", "seconds", "spins")

    def __init__(self) -> None:
        self.spins = 0
        self.hits = 0
        self.seconds = 0.0
        self.crowded = 0
        self.cut = 0
        self.commit = 0

    def fields(self) -> dict[str, int | float]:
        return {"spins": self.spins, "spin_hits": self.hits, "spin_s": round(self.seconds, 3),
                "spins_crowded": self.crowded, "spins_cut": self.cut,
                "spins_commit": self.commit}  # fmt: skip


STATS = SpinStats()  # one per process: each role runs one spinning loop


class SpinPolicy(Protocol):
    """How long a process spins before it sleeps; told when a wait ends with something."""

    def window(self, now: float) -> float:
        """Seconds to keep polling, from `now` (a `time.perf_counter()`), before sleeping."""
        ...

    def note(self, now: float) -> None:
        """A wait ended at `now` with something to do (a message, a writable socket)."""
        ...

    @property
    def cut_s(self) -> float:
        """A spin turn longer than this ends the spin (0: never; see `spin_until`)."""
        ...

    @property
    def cut_turns(self) -> int:
        """How many turns longer than `cut_s` end a spin (`spin_until`)."""
        ...

    @property
    def crowded(self) -> Callable[[], bool] | None:
        """Whether the machine has no idle CPU now (asked after a long turn), or None."""
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

    @property
    def cut_s(self) -> float:
        return 0.0  # `spin_us = N` spins N µs, as it always did

    @property
    def cut_turns(self) -> int:
        return 1

    @property
    def crowded(self) -> Callable[[], bool] | None:
        return None


class RunnableProbe:
    """How many tasks the whole machine has runnable now: /proc/loadavg's fourth field.

    `crowded()` is true when more than `max_runnable` are (the caller counts: it is running).
    One `pread` of an fd kept open, about a microsecond. Where the file cannot be read (not
    Linux), the machine always counts as having room, as before the probe existed.
    """

    __slots__ = ("_fd", "_max")

    def __init__(self, max_runnable: int, path: str = "/proc/loadavg") -> None:
        if max_runnable < 1:
            raise ValueError("need max_runnable >= 1")
        self._max = max_runnable
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def runnable(self) -> int | None:
        """Tasks runnable on the machine now, the caller included; None if unknown."""
        if self._fd is None:
            return None
        try:
            # "0.52 0.58 0.59 3/195 4242": runnable/total tasks is the fourth field.
            return int(os.pread(self._fd, 128, 0).split()[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            return None

    def crowded(self) -> bool:
        runnable = self.runnable()
        return runnable is not None and runnable > self._max

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Ring:
    """The last `history` samples of a time, whole microseconds each (at most `_cap_us`),
    and their sum: what `AdaptiveSpin` and `CommitSpin` remember, with what ends their spins
    (`crowded`, `cut_s`, `cut_turns`). A base class, not a member, so that the loops' every
    wait reads `_sum_us` without a call (`window`)."""

    __slots__ = ("_at", "_cap_us", "_crowded", "_cut_s", "_cut_turns", "_ring", "_sum_us")

    def _cuts(self, crowded: Callable[[], bool] | None, cut_s: float, cut_turns: int) -> None:
        self._crowded = crowded
        self._cut_s = cut_s
        self._cut_turns = cut_turns

    @property
    def cut_s(self) -> float:
        return self._cut_s

    @property
    def cut_turns(self) -> int:
        return self._cut_turns

    @property
    def crowded(self) -> Callable[[], bool] | None:
        return self._crowded

    def _fill(self, history: int, fill_us: int, cap_us: int) -> None:
        self._ring = [fill_us] * history
        self._sum_us = fill_us * history
        self._at = 0
        self._cap_us = cap_us

    def _add(self, seconds: float) -> None:
        sample = round(seconds * 1e6)
        sample = self._cap_us if sample > self._cap_us else 0 if sample < 0 else sample
        at = self._at
        self._sum_us += sample - self._ring[at]
        self._ring[at] = sample
        self._at = (at + 1) % len(self._ring)


def _spin_left(
    start: float, spin_s: float, now: float, crowded: Callable[[], bool] | None
) -> float:
    """Seconds left of a spin of `spin_s` from `start` at `now`; 0 once it is over, or while
    `crowded` says the machine has no idle CPU (counted in `STATS.crowded`)."""
    window = start + spin_s - now
    if window <= 0.0:
        return 0.0
    if crowded is not None and crowded():
        STATS.crowded += 1
        return 0.0
    return window


class AdaptiveSpin(_Ring):
    """`spin_us = "auto"`: spin only while the messages keep coming close together.

    It remembers the last `history` gaps between two noted arrivals (whole microseconds, each
    counted as at most `OUTLIER_GAPS` times `max_gap_s`, so that one stall does not stop the
    spinning for long). While their mean is at most `max_gap_s`, it spins after an arrival for
    twice that mean, at most `max_gap_s`: the next message, if it keeps the rhythm, finds the
    process awake. Otherwise, and once that time has passed, the window is 0 and the process
    sleeps at once. The mean, not each gap, decides, because a process sees alternating gaps
    (a request, then the reply of the next process, then the next request). Memory is the ring,
    whatever the traffic. Time comes in as `now` (seconds, as `time.perf_counter()`); the only
    other input is `crowded`, asked just before a spin would start: while it says the machine
    has no idle CPU, the window is 0.
    """

    __slots__ = ("_last", "_max_gap_s", "_max_gap_us")

    def __init__(
        self,
        max_gap_s: float,
        history: int = HISTORY,
        crowded: Callable[[], bool] | None = None,
        cut_s: float = CUT_S,
        cut_turns: int = CUT_TURNS,
    ) -> None:
        if max_gap_s <= 0 or history < 1 or cut_turns < 1:
            raise ValueError("need max_gap_s > 0, history >= 1 and cut_turns >= 1")
        self._max_gap_s = max_gap_s
        self._max_gap_us = max_gap_s * 1e6
        cap_us = round(OUTLIER_GAPS * self._max_gap_us)
        # A fresh process has seen only long gaps: it sleeps until a rhythm shows.
        self._fill(history, cap_us, cap_us)
        self._last: float | None = None
        self._cuts(crowded, cut_s, cut_turns)

    def note(self, now: float) -> None:
        last, self._last = self._last, now
        if last is not None:
            self._add(now - last)

    def window(self, now: float) -> float:
        last = self._last
        mean_us = self._sum_us / len(self._ring)
        if last is None or mean_us > self._max_gap_us:
            return 0.0
        return _spin_left(last, min(self._max_gap_s, 2e-6 * mean_us), now, self._crowded)

    @property
    def mean_gap_us(self) -> float:
        """The mean of the remembered gaps, outliers capped (for tests and logs)."""
        return self._sum_us / len(self._ring)


class CommitSpin(_Ring):
    """`spin_commit_max_us`: a shard spins while one of its own replies waits on the writer's
    commit, for about as long as the writer's last commits took (docs/runtime.md, "Spinning
    through a commit").

    `window(now, waiting)` is asked before every wait that would sleep, with whether a reply
    of this process waits on a commit now. The first such ask after none waited starts the
    clock (the batch has just been sent); the first ask after the replies went starts from
    `arrived(now)`'s last time (the wake that brought the confirmation) and remembers how long
    that commit took, whole microseconds in a ring of the last `history` (each counted as at
    most `OUTLIER_GAPS` times `max_s`). The spin lasts until the wait's start plus 1.5 times
    their mean, at most `max_s`; none while their mean is above `max_s` (the commits are slow:
    a sleep's wake-up is small beside them), nor while `crowded` says the machine has no idle
    CPU. Nothing waits on an idle server, so it never spins there.
    """

    __slots__ = ("_last", "_max_s", "_max_us", "_since")

    def __init__(
        self,
        max_s: float,
        history: int = HISTORY,
        crowded: Callable[[], bool] | None = None,
        cut_s: float = CUT_S,
        cut_turns: int = CUT_TURNS,
    ) -> None:
        if max_s <= 0 or history < 1 or cut_turns < 1:
            raise ValueError("need max_s > 0, history >= 1 and cut_turns >= 1")
        self._max_s = max_s
        self._max_us = max_s * 1e6
        # A fresh process assumes commits as long as the bound: 1.5 times it is past it, so
        # the first commits spin up to the bound while their times come in.
        self._fill(history, round(self._max_us), round(OUTLIER_GAPS * self._max_us))
        self._since: float | None = None  # when the current wait on a commit started
        self._last = 0.0  # the last wake that ended with something to do
        self._cuts(crowded, cut_s, cut_turns)

    def arrived(self, now: float) -> None:
        """A wait ended at `now` with something to do (perhaps the confirmation)."""
        self._last = now

    def window(self, now: float, waiting: bool) -> float:
        """Seconds to spin from `now` before sleeping (0: sleep at once)."""
        since = self._since
        if not waiting:
            if since is not None:
                self._since = None
                self._add(self._last - since)
            return 0.0
        if since is None:
            self._since = since = now
        mean_us = self._sum_us / len(self._ring)
        if mean_us > self._max_us:
            return 0.0
        return _spin_left(since, min(self._max_s, 1.5e-6 * mean_us), now, self._crowded)

    @property
    def mean_us(self) -> float:
        """The mean of the remembered commit waits (for tests and logs)."""
        return self._sum_us / len(self._ring)


def commit_spin(
    spin_us: int | str,
    commit_max_us: int,
    max_runnable: int = 0,
    cut_us: int = 50,
    cut_turns: int = CUT_TURNS,
) -> CommitSpin | None:
    """The shard's spin through a commit: only with `spin_us = "auto"` and
    `spin_commit_max_us` > 0 (None otherwise); the machine check and the cut as `auto`'s."""
    if spin_us != AUTO or commit_max_us <= 0:
        return None
    probe = RunnableProbe(max_runnable or (os.cpu_count() or 1) + 1)
    return CommitSpin(commit_max_us / 1e6, crowded=probe.crowded, cut_s=cut_us / 1e6,
                      cut_turns=cut_turns)  # fmt: skip


def auto_spin(
    auto_max_us: int, max_runnable: int = 0, cut_us: int = 50, cut_turns: int = CUT_TURNS
) -> AdaptiveSpin:
    """`spin_us = "auto"`'s policy: `spin_auto_max_us`, `spin_auto_max_runnable` (0: the
    machine's CPUs plus one, the round trip's own next hop), `spin_auto_cut_us` (0: never
    cut a spin short) and `spin_auto_cut_turns`; docs/runtime.md."""
    probe = RunnableProbe(max_runnable or (os.cpu_count() or 1) + 1)
    return AdaptiveSpin(auto_max_us / 1e6, crowded=probe.crowded, cut_s=cut_us / 1e6,
                        cut_turns=cut_turns)  # fmt: skip


def spin_policy(
    spin_us: int | str,
    auto_max_us: int,
    max_runnable: int = 0,
    cut_us: int = 50,
    cut_turns: int = CUT_TURNS,
) -> SpinPolicy | None:
    """The policy for the `spin_us` setting: None for 0 (never spin)."""
    if spin_us == AUTO:
        return auto_spin(auto_max_us, max_runnable, cut_us, cut_turns)
    if isinstance(spin_us, int) and spin_us > 0:
        return FixedSpin(spin_us / 1e6)
    if spin_us == 0:
        return None
    raise ValueError(f'spin_us must be "auto" or 0 to {MAX_SPIN_US}, got {spin_us!r}')


def spin_until(
    poll_now: Callable[[], list[T]],
    spin_s: float,
    cut_s: float = 0.0,
    cut_turns: int = 1,
    crowded: Callable[[], bool] | None = None,
) -> list[T]:
    """Call `poll_now` (a zero-timeout poll) until it returns something or `spin_s` passes,
    or, with `cut_s` > 0, until `cut_turns` of its turns (poll and yield) took longer than
    `cut_s` each: other tasks had the CPU meanwhile, and the caller had better sleep. A long
    turn short of `cut_turns` ends the spin too if `crowded` says the machine has no idle CPU
    now: the task that had the CPU is then not the round trip's own.

    Returns its last result, empty if the spin ended with nothing.
    """
    start = prev = time.perf_counter()
    end = start + spin_s
    long_turns = 0
    while True:
        got = poll_now()
        now = time.perf_counter()
        cut = False
        if cut_s > 0.0 and now - prev > cut_s:
            long_turns += 1
            cut = long_turns >= cut_turns or (crowded is not None and crowded())
        if got or now >= end or cut:
            STATS.spins += 1
            STATS.hits += bool(got)
            STATS.cut += cut and not got
            STATS.seconds += now - start
            return got
        os.sched_yield()
        prev = now


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
        got = (
            spin_until(
                lambda: super(SpinningSelector, self).select(0),
                spin_s,
                policy.cut_s,
                policy.cut_turns,
                policy.crowded,
            )
            if spin_s
            else []
        )
        if not got:
            got = super().select(timeout)
        if got:
            policy.note(time.perf_counter())
        return got
