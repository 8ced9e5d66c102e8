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

With a head budget (`[engine] head_jobs`) the count never gets near `RELEASE_FROM`, yet the
shard grows with what it pages in and completes (86 to 209 MB over a drain of 1,000,000, most
of it pymalloc arenas the completed jobs left half full). So the shard also gives memory back
once it is quiet after a busy period and grew (`shardq.runtime._giveback.IdleGiveBack`, which
the front end and the writer use too); both triggers release the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

from shardq.core import Engine
from shardq.core._budget import MemoryBudget
from shardq.core._mutations import Mutation
from shardq.core._packed import pack_completed, pack_job
from shardq.runtime._giveback import (
    IdleGiveBack,
    IdleGrowth,
    malloc_trim,
    release,
    rss_bytes,
)

__all__ = ["TRIM_EVERY_MS", "BudgetCheck", "MemoryReturner", "malloc_trim", "release_memory"]

# How often the memory budget reads the process's RSS (/proc/self/statm: some microseconds).
RSS_EVERY_MS = 50

# How often, at most, a shard over its memory budget trims the C heap (`[process]
# shard_memory_trim_ms`; `BudgetCheck`).
TRIM_EVERY_MS = 1_000

# Below this many jobs at the high-water mark a release is not worth its pause: what a
# smaller backlog leaves behind is a few tens of MB.
RELEASE_FROM = 100_000

_log = structlog.get_logger()


def compact_engine(engine: Engine) -> list[MutableMapping[Any, Any]]:
    """Pack the completed jobs not packed yet (`shardq.core._packed`: one record each
    instead of a graph of objects, decoded on use), and name the engine's dicts that grow
    with its job count, to rebuild at their size."""
    pack_completed(engine.jobs, engine.store.completed_order)
    engine.store.completed_order.compact()
    tables: list[MutableMapping[Any, Any]] = [
        engine.jobs,
        engine.store.results_order,
        engine.store.unleased,
        engine.store.leases,
        engine.store.job_conn,
    ]
    for q in engine.queues.values():
        tables += (q.ids, q.dlq)
    return tables


def release_memory(engine: Engine) -> bool:
    """Collect, rebuild the engine's big tables at their size, and trim the C heap; whether
    the heap could be trimmed. Also bunqueue's `CompactMemory` command."""
    return release(lambda: compact_engine(engine))


class MemoryReturner:
    """Releases memory once the job count has halved, or once the shard is quiet after a
    busy period and grew (see above)."""

    def __init__(
        self,
        engine: Engine,
        settings: IdleGrowth | None = None,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        """`on_release` runs first at each release: the shard closes its backlog's store
        there (its SQLite page cache goes with it; it reopens on the next page read)."""
        self._engine = engine
        self._high = len(engine.jobs)
        self._on_release = on_release
        self.idle = IdleGiveBack(settings or IdleGrowth(), self._compact)

    def _compact(self) -> list[MutableMapping[Any, Any]]:
        if self._on_release is not None:
            self._on_release()
        return compact_engine(self._engine)

    @property
    def releases(self) -> int:
        """How many releases ran, from either trigger."""
        return self.idle.releases

    def after_turn(self, worked: bool, now: float) -> None:
        """Call once per loop turn (`worked`: it handled a message; `now`: `time.monotonic()`):
        a compare or two unless the window is to be armed or has ended."""
        window = self.idle.window
        at = window.quiet_at
        if at is None:
            if worked and window.enabled:
                window.busy(now)
        elif now >= at:
            self.idle.check(now)
        held = len(self._engine.jobs)
        if held > self._high:
            self._high = held
        elif self._high >= RELEASE_FROM and held <= self._high // 2:
            self.release(held)

    def poll_timeout(self, timeout_ms: int | None, now: float) -> int | None:
        """`timeout_ms`, shortened to wake when an idle release is due (`now`:
        `time.monotonic()`)."""
        due = self.idle.window.quiet_at
        if due is None:
            return timeout_ms
        left = max(0, math.ceil((due - now) * 1000))
        return left if timeout_ms is None else min(timeout_ms, left)

    def release(self, held: int) -> None:
        """Collect, rebuild the engine's big tables at their size, and trim the C heap."""
        self.idle.release(rss_bytes(), "halved", jobs=held, high_water=self._high)
        self._high = held


class BudgetCheck:
    """The memory budget's check after each turn (`shardq.core._budget`): it sends the
    longest backlogs' tails cold once the shard's jobs pass the budget; the mutations go to
    `absorb`, with the turn's. Logs once when jobs that cannot go cold alone pass the budget,
    and once when the shard is back under it.

    While the process is over the budget it also trims the C heap (`malloc_trim`), at most
    every `trim_every_ms` (0: never) and only once the process grew by a 32nd of the budget
    since the last trim. Cutting the heads frees jobs, but not the memory a busy shard's
    transients leave free in the C heap: the writer's batches kept until their commit, the
    pages read from the cold backlog, the records and replies of each turn (objects above
    512 bytes live there, not in Python's own arenas). Measured during a 1,000,000-job drain
    at 128 MB: 55 to 64 MB of heap of which 25 to 35 MB free, 4 to 21 MB of it handed back
    per trim, about a millisecond each (bench/results/2026-12-05-s11-shard-peak.md).

    While over the budget it also packs the jobs completed since its last pass
    (`shardq.core._packed`), at each read of the RSS: the completed window (`max_completed`)
    is what a drain adds, pinned, and the idle release that packs it does not come while the
    drain goes on; plain, a completed job holds about twice what it holds packed.
    """

    def __init__(
        self,
        index: int,
        engine: Engine,
        absorb: Callable[[list[Mutation], tuple[()]], None],
        *,
        trim_every_ms: int = TRIM_EVERY_MS,
    ) -> None:
        self._index = index
        self._engine = engine
        self._absorb = absorb
        self._trim_every = trim_every_ms
        self._next_trim = 0
        self._trimmed_at = 0  # the process's bytes above its baseline after the last trim
        self.trims = 0  # trims done, and the bytes they handed back
        self.trimmed_bytes = 0
        # Completed jobs packed over the budget, and the newest id the last pass saw.
        self.packed = 0
        self.pack_passes = 0
        self._packed_to: str | None = None
        self._over = False  # the budget's `over`, as last logged
        # The budget's `scale` as last logged: logged over the budget, each time it rose by
        # a quarter.
        self._scale = 1.0
        # The budget also watches the process (`shardq.core._budget`): its RSS above what it
        # was here, before any job was loaded (the idle baseline), read every `RSS_EVERY_MS`.
        self._next_read = 0
        if engine.memory is not None:
            baseline = rss_bytes()
            engine.memory.process_bytes = lambda: max(0, rss_bytes() - baseline)

    def _trim(self, now: int, memory: MemoryBudget) -> None:
        """Trim the C heap if the process was over its budget at the last read and grew
        since the last trim (see the class docstring)."""
        used = memory.used
        if (
            not self._trim_every
            or used <= memory.budget
            or now < self._next_trim
            or used <= self._trimmed_at + memory.budget // 32
            or memory.process_bytes is None
        ):
            return
        self._next_trim = now + self._trim_every
        if not malloc_trim():
            self._trim_every = 0  # no malloc_trim in this libc: never again
            return
        after = memory.process_bytes()
        self.trims += 1
        self.trimmed_bytes += max(0, used - after)
        self._trimmed_at = after
        if self.trims & (self.trims - 1) == 0:  # the 1st, 2nd, 4th, 8th ...: a log line
            _log.info("memory budget trimmed the heap", shard=self._index, trims=self.trims,
                      trimmed_mb=round(self.trimmed_bytes / 2**20, 1),
                      process_mb_before=used >> 20, process_mb=after >> 20,
                      budget_mb=memory.budget >> 20)  # fmt: skip

    def _pack(self, memory: MemoryBudget) -> None:
        """Over the budget: pack the jobs completed since the last pass (see the class
        docstring). Walks the completed order from its newest id back to the newest one the
        last pass saw."""
        if memory.used <= memory.budget:
            return
        jobs = self._engine.jobs
        newest: str | None = None
        packed = 0
        for job_id in self._engine.store.completed_order.newest():
            if job_id == self._packed_to:
                break
            if newest is None:
                newest = job_id
            job = jobs.get(job_id)
            if job is not None and pack_job(job):
                packed += 1
        if newest is not None:
            self._packed_to = newest
        if not packed:
            return
        self.packed += packed
        self.pack_passes += 1
        if self.pack_passes & (self.pack_passes - 1) == 0:  # the 1st, 2nd, 4th ...: a line
            _log.info("memory budget packed completed jobs", shard=self._index,
                      passes=self.pack_passes, packed=self.packed,
                      process_mb=memory.used >> 20, budget_mb=memory.budget >> 20)  # fmt: skip

    def fit(self, now: int) -> None:
        memory = self._engine.memory
        if memory is None:
            return
        if now >= self._next_read:
            self._next_read = now + RSS_EVERY_MS
            self._pack(memory)
            self._trim(now, memory)
            memory.observe()
        muts = memory.check(now)
        if muts:
            self._absorb(muts, ())
        if memory.used > memory.budget and memory.scale > 1.25 * self._scale:
            self._scale = memory.scale
            head = self._engine.head
            _log.info("memory budget cut the heads to fit the process", shard=self._index,
                      budget_mb=memory.budget >> 20, process_mb=memory.used >> 20,
                      scale=round(memory.scale, 2),
                      head_jobs=head.budget if head is not None else 0)  # fmt: skip
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
