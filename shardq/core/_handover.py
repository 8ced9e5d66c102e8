"""Queues that move between nodes (several nodes on one database, docs/cluster.md).

A node that loses a partition drops its queues from memory: what the database holds of them
is already committed (the writer commits before the lease goes), and the node that gains the
partition loads them from there. Dropping writes nothing: the queues are not deleted, they
are someone else's now. Loading is `Engine.restore` of the gained queues' records into the
running engine (the queues are disjoint from those it holds, so nothing it has is touched).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from ._effects import Effects

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["forget_queues"]


def forget_queues(engine: Engine, names: Collection[str]) -> int:
    """Drop the queues `names` from memory, with their jobs, configs, cron schedules and
    unacknowledged flow notices, and make no mutation. Returns how many jobs were dropped.

    Components that keep a queue's name elsewhere (limiter, groups, stale heap entries) skip
    a name with no queue, so only what holds jobs or schedules is walked here.
    """
    store = engine.store
    discard = Effects()  # what leaving makes (events, counts) concerns nobody now
    dropped = 0
    for name in names:
        q = store.queues.get(name)
        if q is None:
            continue
        for job_id in list(q.ids):
            job = store.jobs.get(job_id)
            if job is not None:
                store.remove(discard, job, emit=False)
                dropped += 1
        del store.queues[name]
    if engine.head is not None:
        engine.head.forget(names)  # their cold jobs are the new owner's now
    schedules = engine.cron.schedules
    for cron in [n for n, rec in schedules.items() if rec.get("queue") in names]:
        del schedules[cron]
    outbox = engine.flows.outbox
    for key in [k for k, notice in outbox.items() if notice.get("cq") in names]:
        del outbox[key]
    return dropped
