"""What the job store and the job operations know of the feature components they call.

The job store (`JobStore`, `_state.py`) calls into the parts that hold jobs back (the limiter,
the flows, the dead letters) at its transitions, and the consume component calls the groups
(a grouped queue's pull), the limiter and the flows. Those components hold the store (and
produce) by class; the store and consume know them only by the protocols here, so no module
of the core imports another that imports it back, even for annotations.
"""

from __future__ import annotations

from typing import Protocol

from ._effects import Effects
from ._job import Job
from ._queue import QueueState

__all__ = ["DeadLetterPart", "FlowPart", "GroupPart", "LimiterPart"]


class LimiterPart(Protocol):
    """The queue limiter (`_limits.QueueLimiter`) as the job store calls it."""

    def held_back(self, queue: str) -> None: ...

    def freed_active(self, q: QueueState) -> None: ...


class GroupPart(Protocol):
    """The job groups (`_group_ops.JobGroups`) as the job store calls them."""

    def take(self, fx: Effects, q: QueueState, count: int, now: int) -> list[Job]: ...


class DeadLetterPart(Protocol):
    """The dead letters (`_dlq.DeadLetters`) as the job store calls them."""

    queues: set[str]

    def tick(self, fx: Effects, now: int) -> None: ...

    def deadline(self) -> int | None: ...


class FlowPart(Protocol):
    """The flows (`_flows.Flows`) as the job store calls them."""

    def blocked(self, job: Job) -> bool: ...

    def child_finished(self, fx: Effects, job: Job, kind: str, now: int) -> None: ...
