"""`TaskResult`: the handle `.delay()` returns, and `TaskFailed`, what `.get()` raises."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from shardq.client import NotFound, Queue, WaitTimeout
from shardq.errors import ShardqError

__all__ = ["EagerResult", "TaskFailed", "TaskResult"]

# WaitJob returns when a job completes, not when it fails: `get` checks the state between
# slices, short at first (a failure is often quick) and growing to one second.
FIRST_SLICE_MS: Final = 50
MAX_SLICE_MS: Final = 1000
CHILD_FAILED: Final = "child "  # how the server words a flow parent's failure (protocol §20.2)
MAX_CHILD_HOPS: Final = 100  # a chain deeper than this reports the failure found that far


class TaskFailed(ShardqError):
    """A task's job ended in the dead-letter queue: its attempts ran out, it timed out, it
    raised `UnrecoverableError`, or no worker knows its name.

    `reason` is the server's failed reason (the exception's message, or e.g. "Job timed out
    after 500ms"); `traceback` the remote traceback's last lines ("" when there was none);
    `exc_type` the remote exception's class name when the traceback ends with it.
    """

    def __init__(
        self, task: str, job_id: str, reason: str | None, traceback: Sequence[str] = ()
    ) -> None:
        self.task = task
        self.job_id = job_id
        self.reason = reason or "unknown reason"
        self.traceback = "\n".join(traceback)
        self.exc_type = _exc_type(traceback)
        message = f"task {task} (job {job_id}) failed: {self.reason}"
        if self.traceback:
            message += f"\n\nRemote traceback (most recent call last):\n{self.traceback}"
        super().__init__(message)


def _failed_child(reason: str | None) -> str | None:
    """The child id of a flow parent's reason "child <id> failed: <error>", else None."""
    if not reason or not reason.startswith(CHILD_FAILED):
        return None
    child, sep, _ = reason[len(CHILD_FAILED) :].partition(" failed: ")
    return child if sep and child else None


def _exc_type(lines: Sequence[str]) -> str | None:
    """`ValueError` from a traceback ending "ValueError: bad input" (or "mod.Error: ...")."""
    if not lines:
        return None
    head = lines[-1].split(":", 1)[0].strip()
    name = head.rsplit(".", 1)[-1]
    return head if head and name.isidentifier() and " " not in head else None


class TaskResult:
    """A task call enqueued on the server: its job id and how to follow it.

    Every method raises what `Queue` raises for a lost connection or a refusal.
    """

    def __init__(self, queue: Queue, job_id: str, task: str) -> None:
        self._queue = queue
        self.id = job_id
        self.task = task

    def __repr__(self) -> str:
        return f"<TaskResult {self.task} {self.id}>"

    def state(self) -> str:
        """waiting, prioritized, delayed (also while waiting out a retry's backoff), active,
        completed, failed (in the DLQ), or unknown (cancelled, or removed)."""
        return self._queue.get_state(self.id)

    def get(self, timeout: float = 30.0) -> Any:
        """Wait for the task to finish and return its result.

        Raises:
            TaskFailed: the job is in the DLQ (with the remote traceback).
            WaitTimeout: it did not finish within `timeout` seconds (also a `TimeoutError`);
                it may still finish later.
            NotFound: the server does not know the job (cancelled or removed).
        """
        deadline = time.monotonic() + timeout
        slice_ms = FIRST_SLICE_MS
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            state = self.state()
            if state == "failed":
                raise self._failure()
            if state == "unknown":
                raise NotFound(f"job {self.id} of task {self.task} is not known to the server")
            wait_ms = min(left_ms, slice_ms)
            reply = self._queue.connection.call(
                {"cmd": "WaitJob", "id": self.id, "timeout": wait_ms}, wait=wait_ms / 1000
            )
            if reply.get("completed"):
                return reply.get("result")
            slice_ms = min(2 * slice_ms, MAX_SLICE_MS)
        raise WaitTimeout(f"task {self.task} (job {self.id}) not finished after {timeout:g} s")

    def _failure(self) -> TaskFailed:
        job = self._queue.get_job(self.id)
        if job is None:
            return TaskFailed(self.task, self.id, "removed after it failed")
        task = self.task or job.name  # a handle made from a bare id learns its task here
        reason, stack = job.failed_reason, job.stacktrace or ()
        # A chain or chord fails because a call it waited for failed ("child <id> failed:
        # ..."): follow the children down to that call, for its own error and traceback.
        for _ in range(MAX_CHILD_HOPS):
            child_id = _failed_child(reason)
            child = self._queue.get_job(child_id) if child_id else None
            if child is None:
                break
            reason = f"{child.name} (job {child.id}) failed: {child.failed_reason}"
            stack = child.stacktrace or ()
            if _failed_child(child.failed_reason) is None:
                break
            reason = child.failed_reason
        return TaskFailed(task, self.id, reason, stack)

    def cancel(self, reason: str | None = None) -> bool:
        """Cancel the task: removed if it has not started; if it runs, the server fails it
        at once (`get` raises `TaskFailed` with reason "cancelled: <reason>", no retry) and
        tells its worker, where `shardq.current_job().cancelled` turns true and an async
        task is cancelled. False when it already finished (or is unknown)."""
        return self._queue.cancel(self.id, reason)


class EagerResult(TaskResult):
    """The outcome of a call that `App(eager=True)` ran in-process at once."""

    def __init__(
        self, job_id: str, task: str, value: Any = None, failure: TaskFailed | None = None
    ) -> None:
        self.id = job_id
        self.task = task
        self._value = value
        self._error = failure

    def state(self) -> str:
        return "failed" if self._error is not None else "completed"

    def get(self, timeout: float = 30.0) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def cancel(self, reason: str | None = None) -> bool:
        return False  # it already ran
