"""The job store's dependencies and dead letters (`JobStore`, `_state`, inherits them).

A job admitted with `dependsOn` (or a flow's parent with `childrenIds`) waits in
`waiting-children` until the jobs it names complete (`blocked_by_deps`); a job's completion
releases those waiting on it (`release_dependents`). A job that fails for good goes to its
queue's dead-letter queue, which keeps at most its `maxEntries` (`dead`, `cap_dlq`). Every
state change goes through the store's `move` and `remove`, as any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._effects import Effects
from ._job import Job
from ._lifecycle import WAITING_CHILDREN
from ._options import as_int
from ._parts import FlowPart
from ._queue import QueueState
from ._tables import dlq_entry

__all__ = ["DepsAndDeadLetters"]


class DepsAndDeadLetters:
    """`blocked_by_deps`, `release_dependents`, `dead` and `cap_dlq`, over `JobStore`'s
    tables and primitives."""

    jobs: dict[str, Job]
    dependents: dict[str, set[str]]
    flows: FlowPart
    is_completed: Callable[[str], bool]
    queue: Callable[[str], QueueState]
    next_seq: Callable[[], int]
    move: Callable[[Effects, Job, str, int, dict[str, Any]], None]
    requeue_or_delay: Callable[[Effects, Job, str, int, dict[str, Any]], None]
    remove: Callable[[Effects, Job], None]

    # -- dependencies ----------------------------------------------------------------------

    def blocked_by_deps(self, job: Job) -> bool:
        if job.opts.get("childrenIds"):
            return self.flows.blocked(job)
        deps = job.opts.get("dependsOn")
        if not deps:
            return False
        pending = [d for d in deps if not self.is_completed(d)]
        for dep in pending:
            self.dependents.setdefault(dep, set()).add(job.id)
        return bool(pending)

    def release_dependents(self, fx: Effects, job_id: str, now: int) -> None:
        if not self.dependents:
            return
        for child_id in sorted(self.dependents.pop(job_id, ())):
            child = self.jobs.get(child_id)
            if child is None or child.state != WAITING_CHILDREN:
                continue
            if child.opts.get("childrenIds"):
                if not self.flows.blocked(child):
                    self.requeue_or_delay(fx, child, "release", now, {})
                continue
            if all(self.is_completed(d) for d in child.opts.get("dependsOn") or ()):
                self.requeue_or_delay(fx, child, "release", now, {})

    # -- dead letters ----------------------------------------------------------------------

    def dead(
        self,
        fx: Effects,
        job: Job,
        reason: str,
        now: int,
        changes: dict[str, Any],
        remove: object = None,
    ) -> None:
        """Send a job to its queue's DLQ (or drop it when removeOnFail says so)."""
        if remove is None:
            remove = job.opts.get("removeOnFail")
        if job.opts and "parentId" in job.opts:
            job.failed_reason = job.failed_reason or reason
            self.flows.child_finished(fx, job, "failed", now)
        if remove:
            self.remove(fx, job)
            return
        q = self.queue(job.queue)
        job.dlq = dlq_entry(job, reason, now, q.dlq_config.get("maxAge"), self.next_seq())
        changes["dlq"] = job.dlq
        self.move(fx, job, "dead", now, changes)
        fx.events.append(("dead", job.queue, job.id))
        self.cap_dlq(fx, q)

    def cap_dlq(self, fx: Effects, q: QueueState) -> None:
        limit = as_int(q.dlq_config.get("maxEntries"), 10_000)
        while len(q.dlq) > max(limit, 0):
            oldest = next(iter(q.dlq))
            self.remove(fx, self.jobs[oldest])
