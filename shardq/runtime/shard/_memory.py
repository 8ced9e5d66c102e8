"""Giving memory back after the engine shrank a lot (a drained backlog).

A shard that held a million jobs and drained them keeps most of that memory without help,
measured on the engine alone (1,000,000 jobs pushed over 4 queues, drained with PULLB/ACKB
of 1,000, 50,000 completed kept): 715 MB after the drain, 351 MB after a full collection,
310 MB once the big dicts were rebuilt at their new size (CPython never shrinks a dict's
table on deletion), 279 MB after `malloc_trim` handed the freed heap back to the kernel.

So after the job count has halved from a high-water mark of at least `RELEASE_FROM` jobs,
the shard does all three, once per halving. The check costs one `len` per loop turn; the
release costs time in proportion to the jobs still held (tens of ms for 50,000) and happens
a handful of times per drained backlog.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

from shardq.core import Engine
from shardq.core._mutations import Mutation

__all__ = ["BudgetCheck", "MemoryReturner", "malloc_trim", "release_memory"]

# Below this many jobs at the high-water mark a release is not worth its pause: what a
# smaller backlog leaves behind is a few tens of MB.
RELEASE_FROM = 100_000

_log = structlog.get_logger()


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


def _rebuild(table: MutableMapping[Any, Any]) -> None:
    # In place, so every holder of the mapping (a queue shares the engine's job dict) sees
    # the new table; insertion order is kept, which the ordered ones rely on.
    items = list(table.items())
    table.clear()
    table.update(items)


def release_memory(engine: Engine) -> bool:
    """Collect, rebuild the engine's big tables at their size, and trim the C heap; whether
    the heap could be trimmed. Also bunqueue's `CompactMemory` command."""
    gc.collect()
    tables: list[MutableMapping[Any, Any]] = [
        engine.jobs,
        engine.store.completed_order,
        engine.store.results_order,
        engine.store.unleased,
        engine.store.leases,
        engine.store.job_conn,
    ]
    for q in engine.queues.values():
        tables += (q.ids, q.dlq)
    for table in tables:
        _rebuild(table)
    return malloc_trim()


class MemoryReturner:
    """Watches the engine's job count and releases memory once it has halved (see above)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._high = len(engine.jobs)
        self.releases = 0

    def after_turn(self) -> None:
        """Call once per loop turn: cheap unless a release is due."""
        held = len(self._engine.jobs)
        if held > self._high:
            self._high = held
        elif self._high >= RELEASE_FROM and held <= self._high // 2:
            self.release(held)

    def release(self, held: int) -> None:
        """Collect, rebuild the engine's big tables at their size, and trim the C heap."""
        started = time.monotonic()
        trimmed = release_memory(self._engine)
        _log.info(
            "memory released",
            jobs=held,
            high_water=self._high,
            malloc_trim=trimmed,
            ms=round((time.monotonic() - started) * 1000),
        )
        self._high = held
        self.releases += 1


class BudgetCheck:
    """The memory budget's check after each turn (`shardq.core._budget`): it sends the
    longest backlogs' tails cold once the shard's jobs pass the budget; the mutations go to
    `absorb`, with the turn's. Logs once when jobs that cannot go cold alone pass the budget,
    and once when the shard is back under it."""

    def __init__(
        self, index: int, engine: Engine, absorb: Callable[[list[Mutation], tuple[()]], None]
    ) -> None:
        self._index = index
        self._engine = engine
        self._absorb = absorb
        self._over = False  # the budget's `over`, as last logged

    def fit(self, now: int) -> None:
        memory = self._engine.memory
        if memory is None:
            return
        muts = memory.check(now)
        if muts:
            self._absorb(muts, ())
        if memory.over is self._over:
            return
        self._over = memory.over
        if memory.over:
            event, log = "memory budget passed by jobs that stay in memory", _log.warning
        else:
            event, log = "memory budget kept again", _log.info
        head = self._engine.head
        log(event, shard=self._index, budget_mb=memory.budget >> 20,
            estimate_mb=memory.resident_bytes() >> 20, jobs=len(self._engine.jobs),
            head_jobs=head.budget if head is not None else 0)  # fmt: skip
