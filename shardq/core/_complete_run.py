"""An ACKB of leased jobs completed in one pass over its jobs.

`Consumer.complete_all` of an ACKB's jobs walked them five times after the lease check: the
completion stamp (and whether any job keeps a result or has options), `move_all`'s test that
they share a state and a queue, `_leave_all`'s lease release, `move_run`'s state, timeline and
`upd`, and `_enter_all`'s completed order and options. For the common ACKB, whose jobs
`_fence_all` already saw active, leased, of one queue, without options or a result, those
facts are known when its check ends, and `complete_leased` does the rest in two loops (the
release, then the stamp, state, timeline and `upd` with the completed order): the same tables,
counts, timelines and mutations, in the same order, as that path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._effects import Effects
from ._job import Job
from ._lifecycle import ACTIVE, COMPLETED, next_state
from ._state import JobStore
from ._tables import extended, trim_completed

__all__ = ["complete_leased"]


def complete_leased(store: JobStore, fx: Effects, jobs: Sequence[Job], now: int) -> bool:
    """Complete `jobs` (at least two, distinct, all active and leased, of one queue, none
    with options or a result kept) as `complete_all(fx, jobs, None, None, now)` would with no
    dependents waiting. False, with nothing done, where that path does more than this one
    (a queue with groups; a lifecycle that does not complete an active job)."""
    q = store.queues[jobs[0].queue]
    if q.groups is not None or next_state(jobs[0].id, ACTIVE, "ack") != COMPLETED:
        return False
    count = len(jobs)
    q.completed += count
    counts = q.counts
    counts[ACTIVE] -= count
    store._release_all(jobs)  # their leases and connections (`_leave_all` of the active)
    out = fx.mutations.append
    done: list[str] = []
    mark = done.append
    entry = (COMPLETED, now, jobs[0].attempts)
    before: Any = None
    after: Any = ()
    payload: dict[str, Any] = {}
    for job in jobs:
        job_id = job.id
        job.completed_at = now
        job.state = COMPLETED  # `move_run`'s loop, inline
        if job.attempts != entry[2]:
            entry = (COMPLETED, now, job.attempts)
            before = None
        if job.timeline is not before:
            before = job.timeline
            after = extended(before, entry)
            payload = {"completedAt": now, "state": COMPLETED, "timeline": list(after)}
        job.timeline = after
        out(("upd", job.key, payload))
        mark(job_id)
    if q.limits is not None and q.limits.conc_blocked:
        store.limiter.freed_active(q)  # a held-back pull may get a slot
    # `_enter_all` of the completed state: no job has options (no uniqueKey to give up), and
    # a head budget's wrapper does nothing more for it (`_head.ColdHead._entered`).
    counts[COMPLETED] += count
    store.completed_order.extend(done)
    finished = q.finished or q.start_finished()
    finished.note("completed", count, now or 0, store.config.max_metric_minutes)
    history = q.history or q.start_history()
    history.completed(jobs, now or 0, store.config.max_history_minutes)
    trim_completed(store, fx)
    return True
