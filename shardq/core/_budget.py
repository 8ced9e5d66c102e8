"""The memory budget of one engine (issue 22): a number of bytes its resident jobs may take.

The head budget (`_head.py`) keeps a number of jobs per queue in memory and pages the rest
in. This sizes those heads from bytes: `MemoryBudget` estimates what the engine's resident
jobs take and, when the estimate passes the budget, installs the head (if it is not in place
yet) and gives every queue the same head size, the largest that brings the estimate back under
the budget, so only the queues with the longest backlogs send their tails cold. While
everything fits nothing is installed: the engine runs exactly the code it runs without a
budget, and the runtime's check after each turn (`check`) costs a `len` and two compares.

The estimate is `len(jobs) x (JOB_BYTES + data)`:

- `JOB_BYTES` is what a resident job costs beyond its data: its object, its id and row key,
  its options map, its entries in the job table, the queue's index and heap (measured: 580
  bytes on CPython 3.11 for waiting jobs; 640 leaves room for the larger active ones).
- `data` is the mean size in memory of the jobs' data (`sys.getsizeof`, deep), measured on
  the `SAMPLE` newest resident jobs each time the job count has moved by `LOOK_EVERY` or an
  eighth since the last look, and averaged with the earlier looks. It follows what is pushed
  now; a backlog whose old jobs are much larger than its new ones is underestimated.

Measured against the RSS 100,000 waiting jobs added to an engine (docs/runtime.md): within
5 % for small maps and 1 KB strings, 9 % under for lists of 100 integers, 45 % over for maps
of 20 fields (their keys are shared in memory, not in the estimate).

Sizing the heads: every queue's waiting head and delayed head get the same size `N`, the
largest for which the pinned jobs (all but waiting and delayed ones: active, completed
kept, and what cannot go cold yet) plus `min(hot, N)` of each head fit in the budget, never
under `head_min_jobs` (a useful PULLB), never above an explicit `head_jobs`. A head above `N`
keeps three quarters of it (`_head.py`'s trim): the low-water mark. As the estimate falls
back (a drain), `N` grows again, by at most an eighth per look (`_grow`), and the heads page
more in as they run low. At start no head is sized above the largest one restored
(`_hold_restored`): the heads the shard held when it stopped.

If the pinned jobs alone (or heads at their floor) exceed the budget, `over` turns True and
stays so until the estimate is back under: the runtime logs it once and exposes it. No work
is refused.

The process, not only the estimate: what a shard's RSS holds beyond its resident jobs
(records kept until their commit, messages in flight, the heap's free blocks, and jobs read
back from storage, which cost more than pushed ones) made a shard given 128 MB reach 267 MB
after a push of 1,000,000 jobs, 356 MB after a restart (bench/results/2026-12-05-s8-rss-peak.md).
So the runtime hands the budget a reader of the process's resident bytes above its idle
baseline (`process_bytes`, /proc/self/statm) and calls `observe` at a short cadence. The
budget turns that into `scale`: the measured bytes per estimated byte (at least 1), which
multiplies the job estimate, so `cap` (and the heads) shrink until the process, not only the
estimate, fits:

- while the process is under the budget, `scale` follows it at each look so that what is
  left of the budget takes jobs at the estimate (`cap = n + (budget - used) / estimate`);
  it falls back to 1 once a release gave the memory back;
- once the process is over the budget, `scale` only rises, and only when the process grew
  since it was last set (by `budget / 32`): freed memory stays resident (arenas), so a
  process that stopped growing is not cut again for memory it can reuse.

`observe` makes a look due when the process passed the budget and grew, so the heads are cut
within one cadence of the process passing it, whatever the job count does. The floor stays
`head_min_jobs` per head: under memory that will not come back the heads shrink to it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from typing import Final, Protocol

from ._cold import ColdBacklog, ColdCounts
from ._config import EngineConfig
from ._head import ColdHead
from ._lifecycle import DELAYED, WAITING
from ._mutations import Mutation
from ._state import JobStore

__all__ = ["JOB_BYTES", "MemoryBudget", "data_size"]

JOB_BYTES: Final = 640
"""What one resident job costs beyond its data (see the module docstring)."""
SAMPLE: Final = 32
"""Jobs whose data one look measures."""
LOOK_EVERY: Final = 1024
"""Jobs the count must move by (or an eighth of it, if more) before the next look."""
WEIGHT_MAX: Final = 1024
"""Measured jobs the mean remembers at most: it follows a change of data size."""
WALK_MAX: Final = 2048
"""Objects one data measure visits at most; past it the rest counts as its encoded size."""
SCALE_MAX: Final = 64.0
"""The most `scale` rises to (a process far over its budget with few jobs: heads at floor)."""

_NOTHING: Final[list[Mutation]] = []


def data_size(data: object) -> int:
    """The bytes `data` takes in memory: its objects' sizes, deep, up to `WALK_MAX` of them."""
    total = 0
    seen = 0
    stack = [data]
    while stack:
        item = stack.pop()
        total += sys.getsizeof(item)
        seen += 1
        if seen >= WALK_MAX:
            return total + 8 * len(stack)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


class Host(Protocol):
    """What the budget reads and calls of its engine (`Engine`)."""

    store: JobStore
    config: EngineConfig
    head: ColdHead | None

    def _install_head(self, head: ColdHead) -> None: ...


class MemoryBudget:
    """Keeps an engine's resident jobs under `budget` bytes (see the module docstring)."""

    def __init__(
        self, engine: Host, backlog: ColdBacklog, budget: int, *, job_bytes: int = JOB_BYTES
    ) -> None:
        self.engine = engine
        self.backlog = backlog
        self.budget = budget
        self.job_bytes = job_bytes
        self.data_bytes = 0.0  # the mean data size measured so far
        self._weight = 0
        self.cap = max(1, budget // job_bytes)  # the jobs that fit, at the current mean
        self.over = False  # pinned jobs (or heads at their floor) alone pass the budget
        self.trims = 0  # times the heads were cut to fit
        # The process's resident bytes above its idle baseline (None: not watched), the last
        # read of it, and the measured bytes per estimated byte (module docstring).
        self.process_bytes: Callable[[], int] | None = None
        self.used = 0
        self.scale = 1.0
        self._used_at = 0  # `used` when `scale` was last set
        self._due = False  # `observe` asks for a look at the next `check`
        # The count outside of which `check` looks again (a look sets both).
        self._lo = 0
        self._hi = min(LOOK_EVERY, self.cap + 1)

    # -- what the runtime reads ------------------------------------------------------------

    @property
    def job_estimate(self) -> int:
        """The bytes one resident job is taken to cost now (before `scale`)."""
        return int(self.job_bytes + self.data_bytes)

    def resident_bytes(self) -> int:
        """The estimate of what the resident jobs take (not scaled: the process's own RSS
        is in `/prometheus` per process)."""
        return len(self.engine.store.jobs) * self.job_estimate

    # -- what the runtime calls ------------------------------------------------------------

    def check(self, now: int) -> list[Mutation]:
        """After a turn: look again if the job count moved enough; cut the heads if the
        estimate passed the budget. Returns the mutations that made (tails sent cold)."""
        n = len(self.engine.store.jobs)
        if self._lo <= n < self._hi and not self._due:
            return _NOTHING
        self._due = False
        return self._look(n, now)

    def observe(self) -> None:
        """Read the process's bytes (`process_bytes`); make a look due at the next `check` if
        it passed the budget and grew since `scale` was last set, or if it is under the
        budget with `scale` raised and moved (module docstring). Cheap: one read."""
        if self.process_bytes is None:
            return
        self.used = used = self.process_bytes()
        margin = self.budget // 32
        if used > self.budget:
            self._due = self._due or used > self._used_at + margin
        elif self.scale > 1.0 and abs(used - self._used_at) > margin:
            self._due = True

    def prepare(self, counts: Mapping[str, ColdCounts]) -> None:
        """At start (or a load of gained partitions), before `Engine.restore`: install the
        head if storage holds cold jobs (a shard that had passed its budget), so that the
        restore watches the rows still marked cold as the head's restore does."""
        if self.engine.head is None and any(c.waiting or c.delayed for c in counts.values()):
            self._size(self._install(), cold=counts)

    def restore_cold(
        self, counts: Mapping[str, ColdCounts], now: int, *, max_seq: int
    ) -> list[Mutation]:
        """After `Engine.restore` of the jobs that are not cold: the head (if `prepare` or a
        look installed it) takes the cold counts and pages its heads in."""
        if self.engine.head is None and not any(c.waiting or c.delayed for c in counts.values()):
            return []
        self.prepare(counts)
        head = self.engine.head
        assert head is not None
        # Size the heads on what the restore loaded (at `prepare` no queue existed yet, so
        # they sat at their floor): measured, scaled to the process, hot jobs counted in.
        if self.process_bytes is not None:
            self.used = self.process_bytes()
        self._measure(len(self.engine.store.jobs))
        self._size(head, cold=counts)
        self._hold_restored(head, counts)
        return head.restore_cold(counts, now, max_seq=max_seq)

    def _hold_restored(self, head: ColdHead, counts: Mapping[str, ColdCounts]) -> None:
        """At start, no head larger than the largest one the restore loaded (the heads the
        shard held when it stopped, which fitted then): a restart reads no page past them,
        and the looks that follow grow the heads an eighth at a time (`_grow`) while the
        process has room, as they do in a drain. A start that paged every head up to its
        size at once overshot the budget before its first look could cut it (1,000,000
        jobs under 128 MB: 72,000 hot jobs loaded, 30,000 to 40,000 paged in, 42,000 to
        51,000 sent back cold)."""
        loaded = max((hot for hot, _ in self._demands(head, counts)), default=0)
        # One more: the restore reads at least one cold job per head, to find its cursor.
        # Never above the size `_size` gave (an explicit `head_jobs` caps it, floor included).
        size = min(head.budget, max(self.engine.config.head_min_jobs, loaded + 1))
        head.budget = size
        head.low = max(1, size // 2)

    # -- looking ---------------------------------------------------------------------------

    def _look(self, n: int, now: int) -> list[Mutation]:
        self._measure(n)
        out: list[Mutation] = []
        head = self.engine.head
        if n > self.cap:
            if head is None:
                head = self._install()
            self._size(head)
            self.trims += 1
            head.touched.update(self.engine.store.queues)
            head.settle(out, now)
            n = len(self.engine.store.jobs)
        elif head is not None and head.cold_total():
            self._grow(head)  # the heads may grow back as the backlog drains
        # The jobs alone, on the estimate (not the process): what `over` has always said.
        self.over = n > max(1, self.budget // self.job_estimate)
        step = max(LOOK_EVERY, n // 8)
        self._lo = max(0, n - step)
        self._hi = min(n + step, self.cap + 1) if not self.over else n + step
        return out

    def _measure(self, n: int) -> None:
        """Average the data size of the newest `SAMPLE` resident jobs into the mean, scale
        to the process (`_calibrate`), and set `cap`."""
        jobs = self.engine.store.jobs
        sizes = [data_size(job.data) for job in islice(reversed(jobs.values()), SAMPLE)]
        if sizes:
            w = self._weight
            self.data_bytes = (self.data_bytes * w + sum(sizes)) / (w + len(sizes))
            self._weight = min(w + len(sizes), WEIGHT_MAX)
        self._calibrate(n)
        self.cap = max(1, int(self.budget / (self.job_estimate * self.scale)))

    def _calibrate(self, n: int) -> None:
        """Set `scale` from the last read of the process (module docstring)."""
        if self.process_bytes is None:
            return
        used = self.used
        # Records the head keeps until their commit cost about a job each: counted in, so a
        # slow writer's lag is not taken for the resident jobs' cost.
        head = self.engine.head
        held = (n + (head.pending_count() if head is not None else 0)) * self.job_estimate
        if used <= self.budget:
            # What is left of the budget takes jobs at the estimate: cap = n + left / estimate.
            self.scale = min(SCALE_MAX, max(1.0, self.budget / max(held + self.budget - used, 1)))
        elif used > self._used_at + self.budget // 32:
            ratio = used / max(held, self.budget // 8, 1)
            self.scale = min(SCALE_MAX, max(self.scale, ratio))
        else:
            return
        self._used_at = used

    def _install(self) -> ColdHead:
        engine = self.engine
        engine._install_head(ColdHead(engine.store, self.backlog))
        assert engine.head is not None
        return engine.head

    def _grow(self, head: ColdHead) -> None:
        """`_size`, growing the heads by at most an eighth (and `head_min_jobs`) per look:
        the job count moves by an eighth between looks, so each growth is measured on the
        process before the next. (Grown at once, heads restored at 18,000 jobs went to
        29,700 on the first look after a restart and the process passed its budget.)"""
        was = head.budget
        self._size(head)
        if head.budget > was > 0:
            size = min(head.budget, was + max(was // 8, self.engine.config.head_min_jobs))
            head.budget = size
            head.low = max(1, size // 2)

    def _size(self, head: ColdHead | None, cold: Mapping[str, ColdCounts] | None = None) -> None:
        """Give every head the size that fits the budget (module docstring)."""
        if head is None:
            return
        config = self.engine.config
        demands = list(self._demands(head, cold))
        pinned = len(self.engine.store.jobs) - sum(hot for hot, _ in demands)
        size = fill([hot + more for hot, more in demands], self.cap - pinned)
        size = max(size, config.head_min_jobs)
        if config.head_jobs:
            size = min(size, config.head_jobs)
        head.budget = size
        head.low = max(1, size // 2)

    def _demands(
        self, head: ColdHead, cold: Mapping[str, ColdCounts] | None
    ) -> Iterator[tuple[int, int]]:
        """(hot, cold) of each queue's waiting and delayed heads. Hot waiting counts the
        jobs on the ready heap at most (grouped jobs wait elsewhere and stay pinned)."""
        for name, q in self.engine.store.queues.items():
            cw, cd = head.cold_counts(name)
            if cold is not None and name in cold:
                # At start: the queue's counts do not hold its cold jobs yet.
                cw, cd = cold[name].waiting, cold[name].delayed
                hot_w = min(q.counts[WAITING], q.ready_len())
                hot_d = q.counts[DELAYED]
            else:
                hot_w = max(0, min(q.counts[WAITING] - cw, q.ready_len()))
                hot_d = max(0, q.counts[DELAYED] - cd)
            yield hot_w, cw
            yield hot_d, cd


def fill(demands: list[int], room: int) -> int:
    """The largest `size` with `sum(min(d, size) for d in demands) <= room` (water
    filling); any size fits when every demand does (then the largest demand, at least 1)."""
    ordered = sorted(d for d in demands if d > 0)
    if sum(ordered) <= room:
        return max(ordered, default=1)
    used = 0
    left = len(ordered)
    for d in ordered:
        # Every demand from here on is at least d: a size s costs used + left * s.
        if used + left * d > room:
            return max(0, (room - used) // left)
        used += d
        left -= 1
    return max(ordered, default=1)
