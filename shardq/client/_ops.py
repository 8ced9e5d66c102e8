"""Queue operations as data, sans-IO: the commands to send and how to read the replies.

`Queue` and `AsyncQueue` are thin runners of these `Op`s, so the two cannot drift apart:

    op = ops.counts("emails")
    replies = connection.call_many(op.commands, check=op.check, idempotent=op.idempotent)
    counts = op.parse(replies)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeAlias, TypeVar

from shardq.client._errors import error_from_reply
from shardq.client._models import DlqEntry, Job, JobCounts, JobOptions

__all__ = ["BulkJob", "Op", "Options", "chunked"]

T = TypeVar("T")
Reply = dict[str, Any]
Options: TypeAlias = JobOptions | Mapping[str, Any] | None
BulkJob: TypeAlias = tuple[str, Any] | tuple[str, Any, Options]
"""One job of `add_bulk`: ``(name, data)`` or ``(name, data, options)``."""

CLEAN_STATES = frozenset(
    {"completed", "failed", "waiting", "delayed", "wait", "prioritized", "waiting-children"}
)


@dataclass(frozen=True)
class Op(Generic[T]):
    """Commands to send together and the function that turns their replies into `T`.

    `check`: refuse `ok: false` replies before `parse` (False: `parse` reads them itself).
    `idempotent`: sending the commands twice does no harm, so a lost reply may be retried.
    `wait_s`: how long the server may hold the reply on purpose (long-polls, WaitJob).
    """

    commands: list[dict[str, Any]]
    parse: Callable[[list[Reply]], T]
    idempotent: bool = True
    check: bool = True
    wait_s: float = 0.0


def _wire_options(options: Options, *, bulk: bool) -> dict[str, Any]:
    if options is None:
        return {}
    if isinstance(options, JobOptions):
        return options.to_wire(bulk=bulk)
    return dict(options)


def _has_custom_id(wire: Mapping[str, Any]) -> bool:
    return bool(wire.get("jobId") or wire.get("customId"))


def _none(replies: list[Reply]) -> None:
    return None


def _count(replies: list[Reply]) -> int:
    return int(replies[0].get("count") or 0)


def chunked(items: Iterable[T], size: int) -> Iterable[list[T]]:
    """`items` in lists of at most `size` (the last may be shorter)."""
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# -- producing ------------------------------------------------------------------------------


def push(queue: str, name: str, data: Any, options: Options) -> tuple[dict[str, Any], bool]:
    """The PUSH of one job, and whether it is idempotent (only with a custom id, `job_id`)."""
    if options is None:
        return {"cmd": "PUSH", "queue": queue, "name": name, "data": data}, False
    wire = _wire_options(options, bulk=False)
    return {"cmd": "PUSH", "queue": queue, "name": name, "data": data, **wire}, _has_custom_id(wire)


def add(queue: str, name: str, data: Any, options: Options) -> Op[str]:
    """PUSH one job; the reply's id. Idempotent only with a custom id (`job_id`)."""
    cmd, idempotent = push(queue, name, data, options)
    return Op([cmd], lambda replies: str(replies[0]["id"]), idempotent=idempotent)


def add_bulk(queue: str, jobs: Sequence[BulkJob]) -> Op[list[str]]:
    """One PUSHB of `jobs`; their ids in order."""
    entries = []
    for job in jobs:
        name, data = job[0], job[1]
        options: Options = job[2] if len(job) > 2 else None
        entries.append({"name": name, "data": data, **_wire_options(options, bulk=True)})
    idempotent = all(_has_custom_id(entry) for entry in entries)
    cmd = {"cmd": "PUSHB", "queue": queue, "jobs": entries}
    return Op([cmd], lambda replies: [str(i) for i in replies[0]["ids"]], idempotent=idempotent)


# -- reading --------------------------------------------------------------------------------


def _job_or_none(replies: list[Reply]) -> Job | None:
    reply = replies[0]
    if reply.get("ok") is True:
        return Job.from_wire(reply["job"])
    error = error_from_reply(reply)
    if "not found" in error.message.lower():
        return None
    raise error


def get_job(job_id: str) -> Op[Job | None]:
    """GetJob; None when the server does not know the id."""
    return Op([{"cmd": "GetJob", "id": job_id}], _job_or_none, check=False)


def get_state(job_id: str) -> Op[str]:
    """GetState: waiting, delayed, active, completed, failed, ... or unknown."""
    return Op([{"cmd": "GetState", "id": job_id}], lambda r: str(r[0].get("state")))


def counts(queue: str) -> Op[JobCounts]:
    """GetJobCounts."""
    return Op(
        [{"cmd": "GetJobCounts", "queue": queue}],
        lambda replies: JobCounts.from_wire(replies[0].get("counts") or {}),
    )


def wait_job(job_id: str, timeout_ms: int) -> Op[tuple[bool, Any]]:
    """WaitJob: (True, result) once completed, (False, None) if `timeout_ms` passed first."""

    def parse(replies: list[Reply]) -> tuple[bool, Any]:
        reply = replies[0]
        return bool(reply.get("completed")), reply.get("result")

    cmd = {"cmd": "WaitJob", "id": job_id, "timeout": timeout_ms}
    return Op([cmd], parse, wait_s=timeout_ms / 1000)


# -- queue control --------------------------------------------------------------------------


def pause(queue: str) -> Op[None]:
    return Op([{"cmd": "Pause", "queue": queue}], _none)


def resume(queue: str) -> Op[None]:
    return Op([{"cmd": "Resume", "queue": queue}], _none)


def is_paused(queue: str) -> Op[bool]:
    return Op([{"cmd": "IsPaused", "queue": queue}], lambda r: bool(r[0].get("paused")))


def drain(queue: str) -> Op[int]:
    """Drain: remove waiting and delayed jobs; how many."""
    return Op([{"cmd": "Drain", "queue": queue}], _count, idempotent=False)


def clean(queue: str, grace_ms: int, state: str, limit: int) -> Op[list[str]]:
    """Clean: remove jobs in `state` finished more than `grace_ms` ago; their ids.

    Raises `ValueError` for a state Clean does not take.
    """
    if state not in CLEAN_STATES:
        raise ValueError(f"state must be one of {sorted(CLEAN_STATES)}, got {state!r}")
    cmd = {"cmd": "Clean", "queue": queue, "grace": grace_ms, "state": state, "limit": limit}
    return Op([cmd], lambda r: [str(i) for i in r[0].get("ids") or ()], idempotent=False)


CANCEL_REFUSED: Final = "Job not found or cannot be cancelled"


def cancel(job_id: str, reason: str | None) -> Op[bool]:
    """Cancel {active: true}: remove a queued job, or stop a running one (dead-lettered with
    reason `cancelled`, its worker told at once); False when there is nothing to cancel
    (unknown, completed or failed)."""
    cmd: dict[str, Any] = {"cmd": "Cancel", "id": job_id, "active": True}
    if reason:
        cmd["reason"] = reason

    def parse(replies: list[Reply]) -> bool:
        reply = replies[0]
        if reply.get("ok") is True:
            return True
        if reply.get("error") == CANCEL_REFUSED:
            return False
        raise error_from_reply(reply)

    return Op([cmd], parse, check=False)


def obliterate(queue: str) -> Op[None]:
    return Op([{"cmd": "Obliterate", "queue": queue}], _none)


# -- the DLQ --------------------------------------------------------------------------------


def dlq(queue: str, count: int | None) -> Op[list[DlqEntry]]:
    """Dlq: the dead-lettered jobs, oldest first (at most `count`)."""
    cmd: dict[str, Any] = {"cmd": "Dlq", "queue": queue}
    if count is not None:
        cmd["count"] = count
    return Op([cmd], lambda r: [DlqEntry.from_wire(e) for e in r[0].get("entries") or ()])


def retry_dlq(queue: str, job_id: str | None, count: int | None) -> Op[int]:
    """RetryDlq: move one job (`job_id`) or the oldest `count` (all) back to waiting."""
    cmd: dict[str, Any] = {"cmd": "RetryDlq", "queue": queue}
    if job_id is not None:
        cmd["jobId"] = job_id
    if count is not None:
        cmd["count"] = count
    return Op([cmd], _count, idempotent=job_id is not None)


def purge_dlq(queue: str) -> Op[int]:
    """PurgeDlq: delete every dead-lettered job; how many."""
    return Op([{"cmd": "PurgeDlq", "queue": queue}], _count, idempotent=False)
