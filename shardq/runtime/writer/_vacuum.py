"""The database file shrinks when jobs leave: incremental vacuum in the writer's idle time.

Deleted rows leave free pages in the file; SQLite reuses them but never gives them back. Once
the writer has committed nothing for `vacuum_idle_ms` and no batch waits, it frees pages a step
at a time (`Storage.release_pages`, one short transaction), and checks its sockets between two
steps: a message that arrives during a pass waits for one step at most, then the pass stops
until the writer is idle again. A pass starts only when at least `vacuum_min_free_pages` pages
are free (a few free pages are reused by the next inserts anyway) and ends with a
`wal_checkpoint(TRUNCATE)` that does not wait for readers, so the WAL, which the steps filled,
shrinks too.

The step's size follows its measured time (`_next_size`): the first frees
`vacuum_pages_per_step` pages; each next one is scaled so that it should take `vacuum_step_ms`,
at most twice the last and at most `vacuum_max_pages_per_step`. What a page costs varies a
hundredfold: a free page at the end of the file is only cut off, one in the middle has a live
page moved into it (the page, its parent and a pointer-map page written to the WAL), and a
loaded machine or SQLite's own checkpoint inside the step multiplies it again. A fixed 256 took
0.7 ms (median) on the test machine, but up to 242 ms in a 1,000,000-job drain with a load
average of 6: the commit waiting behind it waited that long.
`vacuum_step_ms = 0` keeps the size fixed. A long pass logs `vacuum progress` every
`_PROGRESS_EVERY_S` seconds.

One step of 256 pages (1 MiB) took about 1 ms (median) on the 2-core test machine, 10 ms at
the 99th percentile, when SQLite's own WAL checkpoint fell inside it as it does inside any
commit (bench/vacuum.py). The final checkpoint is one fsync-bound operation on at most the WAL
SQLite keeps between its own checkpoints (1000 pages): 10 to 60 ms measured there, up to
160 ms with the machine heavily loaded, as SQLite's own checkpoint inside a commit costs.

The writer's loop (`_process`) owns the timing: `deadline` is when a step is due (None: no
pass is wanted), `step` runs one.

A long free list makes each step's pages dearer (SQLite looks for every page it frees along the
list): when it is long and most of the file, a pass copies the live pages into a compact file
and swaps that in instead (`_rebuild.FileRebuild`), once the writer has been idle for
`vacuum_rebuild_idle_ms` (nothing runs in shorter gaps then). No step ever runs on a list
longer than `vacuum_step_max_free_pages` (`_too_long`, checked before every step: commits
between two steps lengthen it), where even one page could hold a commit up past
`vacuum_step_ms`: when copies went stale or none can be made, such a list waits (`_hold`)
until the copy is tried again.

A file made before shardq vacuumed (auto_vacuum NONE) has nothing a step frees: at start-up,
before the writer reports ready, `convert_old_file` rewrites it once with a full VACUUM if it
is at most `vacuum_convert_max_bytes` (about 60 MB/s on the test machine), else logs how to.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from shardq.runtime._sections import WriterSettings
from shardq.runtime.writer._rebuild import FileRebuild
from shardq.runtime.writer._status import WriterStatus, file_sizes
from shardq.storage import Storage, StorageError, Store

__all__ = ["IdleVacuum", "convert_old_file"]

log = structlog.get_logger()

_PROGRESS_EVERY_S = 5.0  # a pass longer than this logs how far it is, this often
_POLL_S = 0.05  # how often the idle writer looks whether a rebuild's copy is done
_BUSY_RETRY_S = 1.0  # after a backup (or a reader) kept a rebuilt copy from being swapped in
_MAX_STALE = 3  # copies in a row made useless by commits, before steps take over a while
_STEPS_FOR_S = 60.0  # how long, before a rebuild is tried again


@dataclass(slots=True)
class _Pass:
    """A pass under way: it may span several idle times, when commits pause it."""

    started: float
    before: dict[str, int]  # the file sizes when it started
    pages: int = 0  # freed so far
    steps: int = 0
    paused: int = 0  # commits that came during it
    longest: float = 0.0  # seconds, the longest step: what a message may have waited
    largest: int = 0  # the most pages one step asked for
    logged: float = 0.0  # when it last logged its progress (monotonic seconds)
    free: int = 0  # free pages when it started
    rebuild: bool = False  # by a rebuild (`FileRebuild`), not incremental steps
    polls: dict[str, float] = field(default_factory=dict)  # a rebuild's longest look, by state


class IdleVacuum:
    """Gives a store's free pages back a step at a time while the writer is idle.

    `pages_per_step` 0 turns it off; it is the first step's size, and the only one when
    `step_s` is 0; otherwise each step is sized to take about `step_s` seconds, between 1 and
    `max_pages_per_step` pages (the measured size is kept from one pass to the next). A pass is
    wanted after the start and after every commit (`committed`): the commit may have deleted
    rows. A storage error ends the pass (it is logged; the file is as it was) until the next
    commit.
    """

    def __init__(
        self,
        store: Storage,
        data_path: str | Path,
        status: WriterStatus,
        *,
        pages_per_step: int,
        min_free_pages: int,
        idle_s: float,
        step_s: float = 0.0,
        max_pages_per_step: int = 0,
        clock: Callable[[], float] = time.monotonic,
        rebuild: FileRebuild | None = None,
        rebuild_idle_s: float = 1.0,
        max_free_pages: int = 0,
    ) -> None:
        self._store = store
        self._path = data_path
        self._status = status
        self._pages = pages_per_step
        self._size = pages_per_step  # the next step's size
        self._step_s = step_s
        self._max_pages = max(max_pages_per_step, pages_per_step)
        self._min_free = min_free_pages
        self._idle_s = idle_s
        self._clock = clock
        # A pass is wanted once idle after the start too: a previous run (killed before it was
        # idle, or on a file converted just now) may have left free pages.
        self._wanted = pages_per_step > 0  # a commit (or the start) since the last pass ended
        self._since = clock()  # the last commit, or the start
        self._pass: _Pass | None = None
        self._rebuild = rebuild if pages_per_step > 0 else None
        self._stale = 0  # rebuilds in a row that a commit made useless
        self._steps_until = 0.0  # steps, not rebuilds, until then (after `_MAX_STALE`)
        self._rebuild_idle_s = rebuild_idle_s
        self._looked_at = 0.0  # when `_rebuild_due` last counted the pages
        self._next_at = 0.0  # no step before (a rebuild's poll, or its retry)
        self._max_free = max_free_pages  # no step on a longer free list (0: no limit)
        self._held = False  # the hold under way was logged (`_hold`)
        self.holds = 0  # times a step was wanted on a list too long for one

    def committed(self, now: float) -> float | None:
        """A batch committed at `now`: a pass is wanted once the writer is idle again. Returns
        `deadline()` (the writer's `IdleTimers.at` is lowered to it, without another call)."""
        self._since = now
        self._wanted = wanted = self._pages > 0
        if self._pass is not None:
            self._pass.paused += 1
        if self._rebuild is not None:
            self._rebuild.committed()
        return max(now + self._idle_s, self._next_at) if wanted else None

    @property
    def under_way(self) -> bool:
        """Whether a pass (steps or a rebuild) has started and not ended."""
        return self._pass is not None

    def deadline(self) -> float | None:
        """When the next step is due (monotonic seconds), or None if no pass is wanted."""
        return max(self._since + self._idle_s, self._next_at) if self._wanted else None

    def due(self, now: float) -> bool:
        """Whether a step should run at `now` (the caller checks that no batch waits)."""
        return self._wanted and now >= max(self._since + self._idle_s, self._next_at)

    def step(self) -> None:
        """One step: start a pass, free `pages_per_step` pages, or end the pass."""
        try:
            if self._pass is None:
                self._start()
            elif self._pass.rebuild:
                self._rebuilding(self._pass)
            elif self._rebuild_due(self._pass):
                self._pass = None  # the next step starts the rebuild
            elif self._too_long(self._store.free_pages()):
                self._pass = None  # commits lengthened the list: the next step decides anew
            else:
                self._release()
        except StorageError as e:
            log.warning("vacuum stopped; retried after the next commit", error=str(e))
            self._wanted, self._pass = False, None
            if self._rebuild is not None:
                self._rebuild.cancel()

    def stop(self) -> None:
        """The writer stops: a rebuild under way is abandoned (its copy deleted)."""
        if self._rebuild is not None:
            self._rebuild.cancel()

    def _start(self) -> None:
        free = self._store.free_pages()
        self._status.vacuum_checked(free)
        if free < self._min_free:
            self._wanted = False
            return
        sizes = file_sizes(self._path)
        now = self._clock()
        if self._start_rebuild(free, sizes, now):
            return
        if self._too_long(free):  # and no rebuild to wait for: until the next commit
            self._hold(free, "no rebuild", None)
            self._wanted = False
            return
        self._held = False
        log.info("vacuum started", free_pages=free, pages_per_step=self._size, **sizes)
        self._pass = _Pass(now, sizes, logged=now, free=free)
        self._release()

    def _rebuild_due(self, done: _Pass) -> bool:
        """Whether a pass of steps should give way to a rebuild: the writer has been idle
        for `rebuild_idle_s` and the free list calls for one (looked at once a second)."""
        now = self._clock()
        if (
            self._rebuild is None
            or not isinstance(self._store, Store)
            or now < self._steps_until
            or now - self._since < self._rebuild_idle_s
            or now - self._looked_at < 1.0
        ):
            return False
        self._looked_at = now
        pages, free, _size = self._store.page_counts()
        if not self._rebuild.wanted(pages, free):
            return False
        log.info("vacuum steps give way to a rebuild", pages=done.pages, steps=done.steps,
                 free_pages=free, ms=round((now - done.started) * 1000))  # fmt: skip
        return True

    def _start_rebuild(self, free: int, sizes: dict[str, int], now: float) -> bool:
        rebuild = self._rebuild
        if rebuild is None or not isinstance(self._store, Store):
            return False
        pages, free, page_size = self._store.page_counts()
        if not rebuild.wanted(pages, free):
            return False
        if now >= self._steps_until and now - self._since < self._rebuild_idle_s:
            # Not idle long enough for a copy. No steps meanwhile: on a list this long one
            # page cost 13 ms of CPU (175 ms at a load of 22), and they would free next to
            # nothing before the copy does it all.
            self._next_at = self._since + self._rebuild_idle_s
            return True
        if now < self._steps_until or not rebuild.start(pages, free, page_size):
            if self._too_long(free):
                # Not even one page: the copy is tried again after a while, steps never.
                why = "copies went stale" if now < self._steps_until else "no copy"
                self._steps_until = max(self._steps_until, now + _STEPS_FOR_S)
                self._next_at = self._steps_until
                self._hold(free, why, self._steps_until - now)
                return True
            # Steps after all (copies kept going stale, failed, or no disk for one): each page
            # costs more on a long list, so they start at one page and grow to what
            # `vacuum_step_ms` allows.
            self._size = 1
            return False
        self._held = False
        log.info("vacuum started", way="rebuild", free_pages=free, pages=pages, **sizes)
        self._pass = _Pass(now, sizes, logged=now, free=free, rebuild=True)
        self._next_at = now + _POLL_S
        return True

    def _too_long(self, free: int) -> bool:
        """Whether a free list of `free` pages is too long for a step to run on."""
        return 0 < self._max_free < free

    def _hold(self, free: int, why: str, retry_s: float | None) -> None:
        """No step on this list (`vacuum_step_max_free_pages`): logged once per hold."""
        self.holds += 1
        if not self._held:
            self._held = True
            log.info("vacuum steps held: the free list is too long for one",
                     free_pages=free, step_max_free_pages=self._max_free, why=why,
                     retry_s=None if retry_s is None else round(retry_s, 1))  # fmt: skip

    def _rebuilding(self, done: _Pass) -> None:
        """One look at the rebuild under way (`FileRebuild.poll`), and what follows from it."""
        rebuild = self._rebuild
        assert rebuild is not None
        started = self._clock()
        state = rebuild.poll()
        now = self._clock()
        done.longest = max(done.longest, now - started)
        done.polls[state] = max(done.polls.get(state, 0.0), now - started)
        self._next_at = now + (_BUSY_RETRY_S if state == "busy" else _POLL_S)
        if state == "checkpointed":
            self._next_at = now  # the swap is the next idle step
        elif state == "copying" and now - done.logged >= _PROGRESS_EVERY_S:
            done.logged = now
            log.info("vacuum progress", way="rebuild", copied_bytes=rebuild.copied_bytes(),
                     free_pages=done.free, paused=done.paused,
                     ms=round((now - done.started) * 1000))  # fmt: skip
        elif state == "swapped":
            free = self._store.free_pages()
            done.pages, done.steps = done.free - free, 1
            self._stale = 0
            self._status.vacuumed(done.pages, free)
            self._finish(done)
        elif state in ("stale", "failed"):
            self._pass, self._next_at = None, 0.0  # started over at the next idle time
            self._stale = self._stale + 1 if state == "stale" else _MAX_STALE
            if self._stale >= _MAX_STALE:  # failed, or stale too often
                log.info("vacuum rebuild set aside: incremental steps for a while",
                         why=state, steps_s=_STEPS_FOR_S)  # fmt: skip
                self._stale, self._steps_until = 0, now + _STEPS_FOR_S

    def _release(self) -> None:
        done = self._pass
        assert done is not None
        asked = self._size
        started = self._clock()
        released = self._store.release_pages(asked)
        took = self._clock() - started
        self._size = self._next_size(asked, took)
        done.longest = max(done.longest, took)
        done.largest = max(done.largest, asked)
        done.pages += released
        done.steps += 1
        free = self._store.free_pages()
        self._status.vacuumed(released, free)
        if released < asked:  # the free list is empty (or cannot shrink further)
            self._finish(done)
        elif self._clock() - done.logged >= _PROGRESS_EVERY_S:
            done.logged = self._clock()
            log.info(
                "vacuum progress",
                pages=done.pages,
                free_pages=free,
                steps=done.steps,
                paused=done.paused,
                pages_per_step=self._size,
                longest_step_ms=round(done.longest * 1000, 2),
                ms=round((done.logged - done.started) * 1000),
            )

    def _next_size(self, asked: int, took: float) -> int:
        """The next step's size: `asked` scaled to take `step_s` (`took` is what it took),
        at most twice `asked`, between 1 and `max_pages_per_step`; `asked` if not adaptive."""
        if self._step_s <= 0:
            return asked
        scaled = asked * 2 if took <= 0 else round(asked * min(2.0, self._step_s / took))
        return max(1, min(self._max_pages, scaled))

    def _finish(self, done: _Pass) -> None:
        self._wanted, self._pass = False, None
        started = self._clock()
        # A swapped-in file starts with an empty WAL: a checkpoint would only wait on the
        # file system, busy freeing the old file's blocks (150-210 ms measured at 10M).
        complete = done.rebuild or self._store.checkpoint(wait=False)
        checkpoint_s = self._clock() - started
        self._status.save(force=True)  # the last step's figures, which a throttle may hold
        after = file_sizes(self._path)
        log.info(
            "vacuum done",
            way="rebuild" if done.rebuild else "steps",
            pages=done.pages,
            steps=done.steps,
            paused=done.paused,
            ms=round((self._clock() - done.started) * 1000),
            longest_step_ms=round(done.longest * 1000, 2),
            largest_step_pages=done.largest,
            wal_checkpoint="complete" if complete else "partial",
            checkpoint_ms=round(checkpoint_s * 1000, 2),
            database_bytes_before=done.before["database_bytes"],
            wal_bytes_before=done.before["wal_bytes"],
            **({"swap_ms": round(self._rebuild.last_swap_s * 1000, 2),
                "longest_ms": {k: round(v * 1000, 2) for k, v in done.polls.items()}}
               if done.rebuild and self._rebuild is not None else {}),
            **after,
        )


def convert_old_file(store: Store, settings: WriterSettings, progress: Callable[[], None]) -> str:
    """Give a database made before shardq vacuumed (auto_vacuum NONE) the incremental mode,
    with one full VACUUM, if it is at most `vacuum_convert_max_bytes`; return the file's mode
    then ("incremental": the idle vacuum can run; "none"; "full": SQLite shrinks it itself).

    A larger file stays as it is, and a log line says how to convert it. `progress()` is
    called every second while the VACUUM runs (the supervisor's `progress`, which keeps a
    long start alive), from another thread: the caller's waits in SQLite meanwhile. A failed
    VACUUM (too little disk, an I/O error) leaves the file as it was, served unconverted.
    """
    try:
        mode = store.auto_vacuum
    except StorageError as e:
        log.warning("cannot read auto_vacuum; the file is not vacuumed", error=str(e))
        return "none"
    if mode != "none" or settings.vacuum_pages_per_step == 0:
        return mode
    sizes = file_sizes(store.path)
    if sizes["database_bytes"] + sizes["wal_bytes"] > settings.vacuum_convert_max_bytes:
        log.warning(
            "database not converted to incremental vacuum: it will not shrink",
            how=(
                "raise vacuum_convert_max_bytes (SHARDQ_VACUUM_CONVERT_MAX_BYTES) above its"
                " size and restart: one full VACUUM at start-up, needing about twice its size"
                " in free disk"
            ),
            vacuum_convert_max_bytes=settings.vacuum_convert_max_bytes,
            **sizes,
        )
        return mode
    log.info("converting the database to incremental vacuum (one full VACUUM)", **sizes)
    started = time.monotonic()

    def report(elapsed_s: float) -> None:
        progress()
        log.info("converting the database", elapsed_s=round(elapsed_s, 1), **sizes)

    try:
        store.convert_to_incremental(report)
    except StorageError as e:
        log.warning("database not converted; it stays as it was", error=str(e))
        return mode
    try:
        store.checkpoint()  # the VACUUM went through the WAL: a WAL as large as the file
    except StorageError as e:  # the next checkpoint (SQLite's, or the idle one) catches up
        log.warning("WAL checkpoint failed", error=str(e))
    took_ms = round((time.monotonic() - started) * 1000)
    log.info("database converted", ms=took_ms, **file_sizes(store.path))
    return "incremental"
