"""Taking ready jobs off a queue's heap, whatever its limits and groups, for a pull
(`_consume.Consumer.take_many`) and a group's pull (`_group_ops`)."""

from __future__ import annotations

from ._effects import Effects
from ._job import Job
from ._queue import QueueState
from ._state import JobStore

__all__ = ["take_ready", "unexpired"]


def take_ready(store: JobStore, fx: Effects, q: QueueState, count: int, now: int) -> list[Job]:
    """Up to `count` jobs off `q`'s ready heap, best first, whatever its limits and groups
    (`Consumer.take_many` applies those); TTL-expired ones are dropped on the way."""
    taken = q.pop_ready_many(count)
    for job in taken:
        if job.opts and job.opts.get("ttl"):
            return unexpired(store, fx, q, taken, count, now)
    return taken  # nothing to check: no job carries a TTL


def unexpired(
    store: JobStore, fx: Effects, q: QueueState, taken: list[Job], count: int, now: int
) -> list[Job]:
    """`taken` without its TTL-expired jobs (moved to expired), topped up from the heap."""
    live: list[Job] = []
    while taken:
        for job in taken:
            ttl = job.opts.get("ttl") if job.opts else None
            if ttl and now >= job.created_at + ttl:
                store.move(fx, job, "expire", now, {})
            else:
                live.append(job)
        taken = q.pop_ready_many(count - len(live)) if len(live) < count else []
    return live
