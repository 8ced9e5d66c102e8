"""What the client hands back and takes in: `Job`, `JobCounts`, `DlqEntry`, `JobOptions`.

All are frozen dataclasses built from (or into) bunqueue's wire maps. Integers are read
leniently because bunqueue's clients send anything past int32 as a float (docs/protocol.md §2.2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DlqEntry", "Job", "JobCounts", "JobOptions"]


_new = object.__new__
_setattr = object.__setattr__


def _int(value: object, default: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return int(value)


def _opt_int(value: object) -> int | None:
    return None if value is None else _int(value)


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Job:
    """One job as the server reports it (a pulled job, or `get_job`'s view).

    `state` is None on a job handed to a worker (it is active); `result` and `failed_reason`
    come with `get_job`. `raw` is the whole wire map, for the fields not modelled here.
    """

    id: str
    queue: str
    name: str
    data: Any
    attempts: int
    max_attempts: int
    priority: int | float
    created_at: int
    started_at: int | None
    completed_at: int | None
    progress: int | float
    state: str | None
    result: Any
    failed_reason: str | None
    stacktrace: list[str] | None
    custom_id: str | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Job:
        """Build a `Job` from a wire map (missing fields get neutral defaults)."""
        get = raw.get
        priority = get("priority")
        progress = get("progress")
        stack = get("stacktrace")
        attempts, most = get("attempts"), get("maxAttempts")
        created, started, completed = get("createdAt"), get("startedAt"), get("completedAt")
        state, reason, custom = get("state"), get("failedReason"), get("customId")
        # A worker builds one Job per pulled job: fill the instance dict at once instead of
        # the frozen __init__'s 17 object.__setattr__ calls (half the cost; same object).
        # The usual values (ints, None) are taken as they are, without a helper call each, and
        # so are the epoch-ms floats a TCP client gets (docs/protocol.md §2.2), made ints.
        job = _new(cls)
        _setattr(
            job,
            "__dict__",
            {
                "id": str(get("id", "")),
                "queue": str(get("queue", "")),
                "name": str(get("name") or "default"),
                "data": get("data"),
                "attempts": attempts if type(attempts) is int else _int(attempts),
                "max_attempts": most if type(most) is int else _int(most, 1),
                "priority": (
                    priority if type(priority) is int or isinstance(priority, int | float) else 0
                ),
                "created_at": (
                    created
                    if type(created) is int
                    else int(created)
                    if type(created) is float
                    else _int(created)
                ),
                "started_at": (
                    started
                    if started is None or type(started) is int
                    else int(started)
                    if type(started) is float
                    else _int(started)
                ),
                "completed_at": (
                    completed if completed is None or type(completed) is int else _int(completed)
                ),
                "progress": (
                    progress if type(progress) is int or isinstance(progress, int | float) else 0
                ),
                "state": None if state is None else _opt_str(state),
                "result": get("returnvalue"),
                "failed_reason": None if reason is None else _opt_str(reason),
                "stacktrace": [str(s) for s in stack] if isinstance(stack, list) else None,
                "custom_id": None if custom is None else _opt_str(custom),
                "raw": raw,
            },
        )
        return job


@dataclass(frozen=True)
class JobCounts:
    """A queue's jobs by state (`GetJobCounts`). A paused queue's ready jobs are in `paused`."""

    waiting: int = 0
    prioritized: int = 0
    delayed: int = 0
    active: int = 0
    completed: int = 0
    failed: int = 0
    waiting_children: int = 0
    paused: int = 0

    @classmethod
    def from_wire(cls, counts: Mapping[str, Any]) -> JobCounts:
        return cls(
            waiting=_int(counts.get("waiting")),
            prioritized=_int(counts.get("prioritized")),
            delayed=_int(counts.get("delayed")),
            active=_int(counts.get("active")),
            completed=_int(counts.get("completed")),
            failed=_int(counts.get("failed")),
            waiting_children=_int(counts.get("waiting-children")),
            paused=_int(counts.get("paused")),
        )

    @property
    def unfinished(self) -> int:
        """Jobs not yet completed or dead-lettered, whatever holds them back."""
        return self.workable + self.waiting_children + self.paused

    @property
    def workable(self) -> int:
        """Jobs a worker of this queue can still run or is running: waiting, delayed, active."""
        return self.waiting + self.prioritized + self.delayed + self.active


@dataclass(frozen=True)
class DlqEntry:
    """One dead-lettered job: the job, why it failed (`reason`, `error`) and when."""

    job: Job
    reason: str | None
    error: str | None
    entered_at: int | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> DlqEntry:
        job = raw.get("job")
        return cls(
            job=Job.from_wire(job if isinstance(job, Mapping) else {}),
            reason=_opt_str(raw.get("reason")),
            error=_opt_str(raw.get("error")),
            entered_at=_opt_int(raw.get("enteredAt")),
            raw=raw,
        )


@dataclass(frozen=True)
class JobOptions:
    """Options of a new job; None leaves the server's default (docs/protocol.md §5.3).

    `job_id` is an idempotent custom id that becomes the job's id. `max_attempts` counts
    executions in all. `group_id` puts the job in a job group, and `group_max_size` refuses
    the push when that group already holds so many queued jobs (docs/protocol.md §17).
    Durations are milliseconds. `extra` passes any other bunqueue field as is (wire names,
    e.g. ``{"backoff": {"type": "fixed", "delay": 500}}``).
    """

    job_id: str | None = None
    priority: int | None = None
    delay_ms: int | None = None
    max_attempts: int | None = None
    backoff_ms: int | None = None
    ttl_ms: int | None = None
    timeout_ms: int | None = None
    stall_timeout_ms: int | None = None
    unique_key: str | None = None
    durable: bool | None = None
    lifo: bool | None = None
    remove_on_complete: bool | None = None
    remove_on_fail: bool | None = None
    tags: Sequence[str] | None = None
    depends_on: Sequence[str] | None = None
    stack_trace_limit: int | None = None
    group_id: str | None = None
    group_max_size: int | None = None
    extra: Mapping[str, Any] | None = None

    def to_wire(self, *, bulk: bool = False) -> dict[str, Any]:
        """The options as wire fields; in a PUSHB entry the custom id is `customId`."""
        pairs: list[tuple[str, Any]] = [
            ("customId" if bulk else "jobId", self.job_id),
            ("priority", self.priority),
            ("delay", self.delay_ms),
            ("maxAttempts", self.max_attempts),
            ("backoff", self.backoff_ms),
            ("ttl", self.ttl_ms),
            ("timeout", self.timeout_ms),
            ("stallTimeout", self.stall_timeout_ms),
            ("uniqueKey", self.unique_key),
            ("durable", self.durable),
            ("lifo", self.lifo),
            ("removeOnComplete", self.remove_on_complete),
            ("removeOnFail", self.remove_on_fail),
            ("tags", list(self.tags) if self.tags is not None else None),
            ("dependsOn", list(self.depends_on) if self.depends_on is not None else None),
            ("stackTraceLimit", self.stack_trace_limit),
            ("groupId", self.group_id),
            ("groupMaxSize", self.group_max_size),
        ]
        wire = {key: value for key, value in pairs if value is not None}
        wire.update(self.extra or {})
        return wire
