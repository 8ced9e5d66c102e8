"""Giving memory back to the kernel after a busy period: one helper for every server process.

A CPython process that was busy keeps most of the memory it grew to after the work is done:
freed objects leave pymalloc arenas partly used, a dict never shrinks its table when keys are
deleted, and glibc keeps freed heap at the top of its arenas. Measured on a two-shard server
after 1,000,000 jobs were pushed and drained (BENCHMARKS.md, bench/results): the front end
grew from 57 to 94 MB and the writer from 64 to 96 MB, and neither gave anything back while
idle.

`release` does what frees it: a full collection, a rebuild of the big dicts the caller names
(at their present size, in place), and `malloc_trim(0)`, which hands glibc's free heap back.
`IdleGiveBack` decides when: some work arms it; `idle_s` later it looks at the CPU time the
process used meanwhile, and a window under `QUIET_CPU_SHARE` of a CPU counts as quiet (a
process is never quiet without messages: the HTTP process asks the shards for their counts
every second, which costs them well under that); a busy window arms it again. Once quiet, it
reads its resident size (one read of /proc/self/statm) and releases only if that grew by at
least `grow_bytes` since the last release (or the start), so an idle server that grew nothing
pays nothing, and a release that could free nothing is not repeated. Each release is
logged ("memory given back") with the sizes before and after and its pause.

The pause is a full collection over what the process holds, plus what the owner compacts:
tens of ms for the front end and the writer, about 0.35 s of CPU for a shard that packs
50,000 completed jobs (`shard/_memory.py`; later releases pack only the new ones). It happens
once at the end of a busy period.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import os
import time
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

import structlog

from shardq.runtime._sections import ProcessSettings

__all__ = [
    "IdleGiveBack",
    "IdleGrowth",
    "give_back_when_quiet",
    "malloc_trim",
    "rebuild",
    "release",
    "rss_bytes",
]

_log = structlog.get_logger()
# A window in which the process used less CPU than this share of it counts as quiet (an idle
# front end or shard, the HTTP process's polls included, uses well under 0.1 %).
QUIET_CPU_SHARE = 0.01
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _load_trim() -> Callable[[int], int] | None:
    # glibc only; elsewhere (musl, macOS) the collection and the dict rebuild still help.
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_TRIM = _load_trim()


def malloc_trim() -> bool:
    """Return the C heap's free memory to the kernel; False where libc has no malloc_trim."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def rebuild(tables: Iterable[MutableMapping[Any, Any]]) -> None:
    """Rebuild each dict at its present size (CPython never shrinks a table on deletion).

    In place, so every holder of a mapping sees the new table; insertion order is kept, which
    the ordered ones rely on.
    """
    for table in tables:
        items = list(table.items())
        table.clear()
        table.update(items)


def release(tables: Callable[[], Iterable[MutableMapping[Any, Any]]] | None = None) -> bool:
    """Collect, call `tables()` (which may compact what the caller holds, and names the
    dicts to rebuild), rebuild those, and trim the C heap; whether the heap could be
    trimmed."""
    gc.collect()
    if tables is not None:
        rebuild(tables())
    return malloc_trim()


class _Statm:
    """/proc/self/statm kept open: a read is one `pread` at offset 0 (the kernel renders the
    file anew on each read from its start), where opening it each time cost nine system calls
    (open, fstat, ioctl, lseek, read, read, close and Python's buffering). The descriptor is
    not inherited by a started program (Python opens it close-on-exec) and is dropped in a
    forked child, whose /proc/self is another process."""

    def __init__(self) -> None:
        self._fd = -1
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1

    def read(self) -> bytes:
        if self._fd < 0:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(self._fd, 256, 0)


_STATM = _Statm()


def rss_bytes() -> int:
    """This process's resident set size, from /proc/self/statm (0 where there is none)."""
    try:
        return int(_STATM.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class QuietWindow:
    """When a process has been quiet for `idle_s` after some work: `busy(now)` arms it (if it
    is not armed yet), `deadline()` says when to look, and `due(now)` says whether the window
    that ended was quiet (it used under `QUIET_CPU_SHARE` of a CPU). A busy window arms the
    next one; a quiet one disarms it. `idle_s` 0: never armed."""

    def __init__(self, idle_s: float) -> None:
        self._idle_s = idle_s
        self.enabled = idle_s > 0  # else `busy` never arms it
        # When `due` has something to say (read it, never set it): a loop that runs every
        # turn compares against it instead of calling `deadline` and `due`.
        self.quiet_at: float | None = None
        self._window = (0.0, 0.0)  # (monotonic time, CPU time) when it was armed

    def busy(self, now: float) -> None:
        if self._idle_s > 0 and self.quiet_at is None:
            self.quiet_at = now + self._idle_s
            self._window = (now, time.process_time())

    def deadline(self) -> float | None:
        """When `due` has something to say (None: nothing armed)."""
        return self.quiet_at

    def due(self, now: float) -> bool:
        """Whether a quiet window ended by `now`. Call it on every wake: a window that ended
        always moves the deadline (armed again if it was busy, cleared if quiet)."""
        if self.quiet_at is None or now < self.quiet_at:
            return False
        started, cpu = self._window
        used = time.process_time()
        if used - cpu >= QUIET_CPU_SHARE * max(now - started, self._idle_s):
            self.quiet_at = now + self._idle_s
            self._window = (now, used)
            return False
        self.quiet_at = None
        return True


@dataclass(frozen=True, slots=True)
class IdleGrowth:
    """When a process acts on the memory a busy period left: once quiet for `idle_s` after work
    (0: never), if it holds more than `grow_bytes` beyond its reference size. One shape for the
    give-back here and the shard's and the writer's recycles; each reads its two `[process]`
    keys (docs/runtime.md)."""

    idle_s: float = 2.0
    grow_bytes: int = 8 << 20

    @classmethod
    def give_back(cls, process: ProcessSettings) -> IdleGrowth:
        """`memory_release_idle_ms` and `memory_release_grow_mb`: the growth since the last
        release (or the start)."""
        return cls._of(process.memory_release_idle_ms, process.memory_release_grow_mb)

    @classmethod
    def shard_recycle(cls, process: ProcessSettings) -> IdleGrowth:
        """`shard_recycle_idle_ms` and `shard_recycle_grow_mb`: the growth beyond what a fresh
        shard would take."""
        return cls._of(process.shard_recycle_idle_ms, process.shard_recycle_grow_mb)

    @classmethod
    def writer_recycle(cls, process: ProcessSettings) -> IdleGrowth:
        """`writer_recycle_idle_ms` and `writer_recycle_grow_mb`: the growth beyond the
        writer's size at its start."""
        return cls._of(process.writer_recycle_idle_ms, process.writer_recycle_grow_mb)

    @classmethod
    def _of(cls, idle_ms: float, grow_mb: int) -> IdleGrowth:
        return cls(idle_ms / 1000, grow_mb << 20)

    @property
    def enabled(self) -> bool:
        return self.idle_s > 0


class IdleGiveBack:
    """Releases memory once the process is quiet after a busy period (see above).

    The owner calls `busy(now)` when it did work, sleeps no longer than `deadline()`, and
    calls `check(now)` after each wake; `check` releases once a window was quiet and the
    process grew. Nothing is armed until the first `busy`, so an idle process is never woken
    for this.
    """

    def __init__(
        self,
        settings: IdleGrowth,
        tables: Callable[[], Iterable[MutableMapping[Any, Any]]] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._tables = tables
        self._clock = clock
        self.window = QuietWindow(settings.idle_s if settings.enabled else 0)
        self._baseline = rss_bytes()
        self.releases = 0

    def busy(self, now: float) -> None:
        """Work was done at `now`: arm the check `idle_s` from now (if not armed yet)."""
        self.window.busy(now)

    def deadline(self) -> float | None:
        """When `check` has something to do (None: nothing armed)."""
        return self.window.deadline()

    def check(self, now: float) -> bool:
        """When due: arm again if the window was busy, else release if the process grew;
        whether it released. Call it on every wake: a due check always moves the deadline."""
        if not self.window.due(now):
            return False
        before = rss_bytes()
        if before - self._baseline < self._settings.grow_bytes:
            return False
        self.release(before, "idle")
        return True

    def rebase(self) -> None:
        """Take the present size as the baseline (after a release done elsewhere)."""
        self._baseline = rss_bytes()

    def release(self, before: int, reason: str, **facts: Any) -> None:
        """Release now, log it, and take the size after as the new baseline."""
        started = self._clock()
        trimmed = release(self._tables)
        after = rss_bytes()
        self._baseline = after
        self.releases += 1
        _log.info(
            "memory given back",
            reason=reason,
            rss_mb_before=round(before / 2**20, 1),
            rss_mb_after=round(after / 2**20, 1),
            malloc_trim=trimmed,
            ms=round((self._clock() - started) * 1000),
            **facts,
        )


async def give_back_when_quiet(give_back: IdleGiveBack, period_s: float) -> None:
    """For an asyncio process, which has no one place that sees every message: every
    `period_s` (the idle time), arm the check and run it (the CPU time decides whether the
    window was quiet). Runs until cancelled."""
    while True:
        now = time.monotonic()
        give_back.busy(now)
        give_back.check(now)
        await asyncio.sleep(period_s)
