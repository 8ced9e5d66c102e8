"""What the job store and the engine's parts know of each other: the calls each makes.

The job store (`JobStore` and the mixins over it) calls into the parts that hold jobs back
(the limiter, the groups, the flows, the dead letters) at its transitions; the flows call the
store's transitions and pushes back. Each side is typed against a protocol here rather than
against the other's class, so no module of the core imports another that imports it back,
even for annotations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ._effects import Effects
from ._job import Job
from ._queue import QueueState

__all__ = ["DeadLetterPart", "FlowPart", "FlowStore", "GroupPart", "LimiterPart"]


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


class FlowStore(Protocol):
    """The job store as the flows call it: its tables, transitions and pushes."""

    jobs: dict[str, Job]
    dep_done: dict[str, None]
    dependents: dict[str, set[str]]

    def find(self, job_id: object) -> Job | None: ...

    def job_or_error(self, job_id: object, message: str) -> Job: ...

    def is_completed(self, job_id: str) -> bool: ...

    def finalize(self, job: Job) -> None: ...

    def move(
        self, fx: Effects, job: Job, event: str, now: int, changes: dict[str, Any]
    ) -> None: ...

    def remove(self, fx: Effects, job: Job, *, emit: bool = True) -> None: ...

    def dead(
        self,
        fx: Effects,
        job: Job,
        reason: str,
        now: int,
        changes: dict[str, Any],
        remove: object = None,
    ) -> None: ...

    def requeue_or_delay(
        self, fx: Effects, job: Job, event_now: str, now: int, changes: dict[str, Any]
    ) -> None: ...

    def confirm(self, job_ids: Iterable[str]) -> set[str]: ...

    def cmd_push(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]: ...
