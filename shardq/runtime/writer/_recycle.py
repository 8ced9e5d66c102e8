"""A writer recycle: a writer that stays far larger than a fresh one hands over to a new process.

After a large drain the writer keeps memory its idle give-back (`_giveback.py`) cannot return:
pymalloc gives an arena back only once every block in it is free, and a few dozen small
objects made through the busy period (its clocks and counters, the statement text cache's
keys, the reopened connection's statement cache) sit in most of the arenas the period grew.
Measured after 1,000,000 jobs pushed and drained on one shard's queues: the writer settled at
59 to 66 MB, a fresh one holds 36. Nothing it holds outlives it: every mutation a shard sent
is either committed (and confirmed) or still kept by that shard until confirmed, and a shard
resends what no writer confirmed when its link connects again (`links._writer`). So, like a
shard (`shard/_recycle.py`), the writer can give that memory back by being replaced.

Once the writer has been quiet for `writer_recycle_idle_ms` after work (the CPU-share test of
`QuietWindow`), with nothing waiting (no batch, no retry, no vacuum pass or rebuild under way,
no Drain range), it compares its RSS with its own size right after its start plus
`writer_recycle_grow_mb`. Above that, it tells the supervisor (`recycled`, with its RSS),
stops as on SIGTERM (its buffer is empty: no commit to make; a checkpoint) and exits 0; the
supervisor starts the next writer at once (no backoff, not counted as a restart) and logs
`writer recycled` with the sizes before and after. The shards and the front end connect to
the new writer as after any writer restart; a durable push that arrives meanwhile waits for
the new writer's commit (its start: well under a second on an idle machine).

Only a writer on SQLite recycles: on PostgreSQL the writer holds the node's partition
leases, which a stop hands to another node.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from shardq.runtime._giveback import IdleGrowth, QuietWindow, rss_bytes

__all__ = ["WriterRecycle"]

_log = structlog.get_logger()


class WriterRecycle:
    """Decides when the writer should recycle (see above); the writer does the rest.

    `blocker()` names what forbids a recycle now (None: nothing). The owner calls `busy(now)`
    on each turn that handled a message, sleeps no longer than `deadline()`, and asks
    `due(now)` after each wake: the RSS in bytes when it should stop to be replaced.
    """

    def __init__(self, settings: IdleGrowth, blocker: Callable[[], str | None]) -> None:
        self._settings = settings
        self._blocker = blocker
        self.fresh_bytes = rss_bytes()  # the store open, before any batch: a fresh writer
        self._window = QuietWindow(settings.idle_s if settings.enabled else 0)
        self._declined: str | None = None  # the last reason logged for not recycling

    @property
    def limit(self) -> int:
        """The RSS above which the writer recycles, in bytes."""
        return self.fresh_bytes + self._settings.grow_bytes

    def busy(self, now: float) -> None:
        """Work was done at `now`: check `idle_s` from now (if not armed yet)."""
        self._window.busy(now)

    def deadline(self) -> float | None:
        return self._window.deadline()

    def due(self, now: float) -> int | None:
        """The RSS in bytes if the writer should recycle now, else None. A due check always
        moves the deadline (armed again after a busy window, cleared after a quiet one); a
        check that something blocks arms it again, so the writer looks once more later."""
        if not self._window.due(now):
            return None
        rss = rss_bytes()
        if rss <= self.limit:
            self._declined = None
            return None
        reason = self._blocker()
        if reason is None:
            return rss
        self._window.busy(now)  # over the limit: look again once what blocks is done
        if reason != self._declined:  # once per change of reason
            self._declined = reason
            _log.info("writer not recycling", reason=reason, rss_mb=round(rss / 2**20, 1),
                      limit_mb=round(self.limit / 2**20, 1))  # fmt: skip
        return None
