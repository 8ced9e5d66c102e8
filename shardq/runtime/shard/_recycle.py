"""A shard recycle: a shard that stays far larger than what it holds hands over to a fresh process.

After a large backlog drains, a shard keeps most of the memory it grew to even after the
idle give-back (`_giveback.py`): pymalloc cannot return an arena while one object lives in
it, and the few survivors of a drain (the newest `max_completed` completed jobs, the queue
tables) are spread over most of them. Measured with 1,000,000 jobs under a 128 MB budget
(bench/results/2026-12-05-s8-rss-drain.md): 254 MB after the drain and the give-back, where a
fresh process loading the same jobs holds a fraction of that. A fresh process is the one
place where that memory comes back whole, and a shard's graceful stop and start lose nothing
(its restart loads only the heads of its queues).

So once a shard has been quiet for `shard_recycle_idle_ms` after a busy period (the CPU-share
test of `IdleGiveBack`), it compares its RSS with what a fresh process holding its jobs would
take, plus `shard_recycle_grow_mb`. A fresh process takes the size it had before recovery
(`fresh_bytes`), plus its completed window's estimate (`JOB_BYTES` and the mean data size,
the memory budget's; a fresh process packs them, `shardq.core._packed`, and holds them at
0.7-0.8 times it), plus `factor` times its other jobs' estimate. `factor` is measured once,
after the start's recovery: the RSS the loaded jobs other than completed ones took per
estimated byte (at least `RECYCLE_FACTOR`, at most `FACTOR_MAX`, and `RECYCLE_FACTOR` when
they were too few to measure). Above that, it recycles:

1. it tells the front end (`recycle`), which sends every request it routed to the shard so
   far, then `recycle-go`, and holds the shard's requests from then on;
2. at `recycle-go` the shard answers its parked long-polls with an empty pull (the client
   polls again, as after a timeout), commits its last batch, tells the supervisor
   (`recycled`, with its RSS) and exits 0;
3. the supervisor starts its replacement at once (no backoff, not counted as a restart, no
   `shard-down` to the front end) and logs `shard recycled` with the RSS before and after;
4. the front end connects to the new process and sends it what it held; the new shard serves
   them once recovered, as it does after any restart.

A shard that holds an active job or a parked WaitJob, or wrote nothing since it started, never
recycles (a worker's lease would not survive it, or there is nothing to give back); nor does
one whose front end is not connected. Clients connected to its direct port do not hold it
back: its stop ends their connections cleanly (`shard._direct`, `DirectPort.quiesce`), and
they push through the front end, which holds their pushes too. If a request that came between
its `recycle` and the `recycle-go` made a job active, it calls the recycle off (`recycle-off`:
the front end sends what it held) and carries on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog

from shardq.runtime import _messages as msgs
from shardq.runtime._giveback import IdleGrowth, QuietWindow, rss_bytes

__all__ = [
    "CALIBRATE_FROM",
    "FACTOR_MAX",
    "RECYCLE_FACTOR",
    "RecycleCheck",
    "ShardRecycle",
]

_log = structlog.get_logger()

# The RSS a fresh process is taken to need per byte its jobs other than completed ones are
# estimated to take, at least. Measured: a start that loaded 72,000 hot waiting jobs took 2.2
# to 2.7 times their estimate; a fresh shard holding the 50,000 completed jobs of the window
# takes about 0.8 times theirs (counted at 1). Twice the whole estimate, as before, plus
# 64 MB, left a shard at 135-158 MB after a drain of ten million where a fresh one holds
# about 70 (bench/results/2026-12-05-s12-settle.md).
RECYCLE_FACTOR: Final = 1.0
# The most `factor` is measured at (a start whose RSS grew for another reason than its jobs).
FACTOR_MAX: Final = 4.0
# A start whose jobs are estimated under this many bytes measures no `factor` (too small a
# load: the RSS it adds is mostly the process's own).
CALIBRATE_FROM: Final = 16 << 20


class RecycleCheck:
    """Decides when the shard should recycle (see above); the shard does the rest.

    `estimate()` gives the bytes the shard's jobs are taken to need (its completed window's,
    its other jobs'); `blocker()` names what
    forbids a recycle now (None: nothing). The owner calls `busy(now)` on each turn that did
    work, sleeps no longer than `deadline()`, and asks `due(now)` after each wake.
    """

    def __init__(
        self,
        settings: IdleGrowth,
        estimate: Callable[[], tuple[int, int]],
        blocker: Callable[[], str | None],
    ) -> None:
        self._settings = settings
        self._estimate = estimate
        self.blocker = blocker
        self.fresh_bytes = rss_bytes()  # before recovery: what a new process costs
        self.factor = RECYCLE_FACTOR  # RSS per estimated byte of a fresh process's jobs
        self.window = QuietWindow(settings.idle_s if settings.enabled else 0)
        self._declined: str | None = None  # the last reason logged for not recycling

    def calibrate(self, rss: int) -> None:
        """`rss`: the process's size after its start's recovery and release. Measure
        `factor` from it (see the module docstring)."""
        done, other = self._estimate()
        if other >= CALIBRATE_FROM:
            measured = (rss - self.fresh_bytes - done) / other
            self.factor = min(FACTOR_MAX, max(RECYCLE_FACTOR, measured))
        else:
            # Too few jobs to measure by: what the jobs do not explain is what the start
            # itself costs, the modules the storage loaded included (psycopg and asyncio on
            # PostgreSQL come after the size above was read), and a fresh process pays it too.
            self.fresh_bytes = max(self.fresh_bytes, rss - done - int(self.factor * other))

    def limit(self) -> int:
        """The RSS above which the shard recycles, in bytes."""
        done, other = self._estimate()
        return self.fresh_bytes + self._settings.grow_bytes + done + int(self.factor * other)

    def busy(self, now: float) -> None:
        """Work was done at `now`: check `idle_s` from now (if not armed yet)."""
        self.window.busy(now)

    def deadline(self) -> float | None:
        return self.window.deadline()

    def due(self, now: float) -> int | None:
        """The RSS in bytes if the shard should recycle now, else None. A due check always
        moves the deadline (re-armed after a busy window, cleared after a quiet one)."""
        if not self.window.due(now):
            return None
        rss, limit = rss_bytes(), self.limit()
        reason = "under the limit" if rss <= limit else self.blocker()
        if reason is None:
            self._declined = None
            return rss
        if reason != self._declined:  # once per change: an idle server checks every window
            self._declined = reason
            _log.info("shard not recycling", reason=reason, rss_mb=round(rss / 2**20, 1),
                      limit_mb=round(limit / 2**20, 1), factor=round(self.factor, 2),
                      fresh_mb=round(self.fresh_bytes / 2**20, 1))  # fmt: skip
        return None


# A `recycle` the front end did not answer (it restarted meanwhile) is asked again after this.
ASK_AGAIN_S: Final = 10.0


class ShardRecycle:
    """The shard's side of a recycle: when to ask the front end, and the stop at `recycle-go`.

    `send(msg)` sends to the front end and returns whether a front end is connected;
    `on_go(rss)` tells the supervisor and stops the shard's loop.
    """

    def __init__(
        self,
        index: int,
        check: RecycleCheck,
        send: Callable[[Mapping[str, Any]], bool],
        on_go: Callable[[int], None],
    ) -> None:
        self._index = index
        self.check = check
        self._send = send
        self._on_go = on_go
        self._asked_at: float | None = None
        self.rss = 0  # the RSS when it asked
        self.going = False

    def after_turn(self, worked: bool, now: float) -> None:
        """Call once per loop turn (`worked`: it handled a message; `now`: `time.monotonic()`):
        a compare or two unless the check's window is to be armed or has ended."""
        window = self.check.window
        at = window.quiet_at
        if at is None:
            if worked and window.enabled:
                window.busy(now)
            return
        if now < at:
            return  # `check.due` has nothing to say yet
        if self._asked_at is not None and now - self._asked_at < ASK_AGAIN_S:
            return
        rss = self.check.due(now)
        if rss is None or not self._send(msgs.recycle(self._index)):
            return
        self._asked_at, self.rss = now, rss
        _log.info(
            "shard recycling: asked the front end to hold its requests",
            rss_mb=round(rss / 2**20, 1),
            limit_mb=round(self.check.limit() / 2**20, 1),
            fresh_mb=round(self.check.fresh_bytes / 2**20, 1),
            factor=round(self.check.factor, 2),
        )

    def poll_timeout(self, timeout_ms: int | None, now: float) -> int | None:
        """`timeout_ms`, shortened to wake when the check is due (`now`: `time.monotonic()`)."""
        due = self.check.window.quiet_at
        if due is None:
            return timeout_ms
        left = max(0, math.ceil((due - now) * 1000))
        return left if timeout_ms is None else min(timeout_ms, left)

    def go(self) -> bool:
        """`recycle-go` came: every request the front end routed here is in. Stop, unless
        something the shard took meanwhile forbids it (a pull made a job active): then tell
        the front end to send the held requests (`recycle-off`) and carry on."""
        blocked = self.check.blocker()
        if blocked is not None:
            self._asked_at = None
            self._send(msgs.recycle_off(self._index))
            _log.info("shard recycle called off", reason=blocked)
            return False
        if not self.going:
            self.going = True
            self._on_go(rss_bytes())
        return True
