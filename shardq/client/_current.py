"""`current_job()`: the job a handler is running, and whether it was cancelled.

A worker sets it around each handler call (in the handler's thread for a sync handler, in its
task for an async one). When the server pushes a cancel for that job (`Cancel {active: true}`,
docs/protocol.md §8) the worker marks it: `cancelled` turns true (a sync handler checks it, or
waits on `wait_cancelled`), and an async handler's task is cancelled as well.
"""

from __future__ import annotations

import contextvars
import threading
from typing import TYPE_CHECKING, Any

from shardq.client._errors import UnrecoverableError
from shardq.client._models import Job

if TYPE_CHECKING:  # only an async handler's worker binds a task: it imported asyncio
    import asyncio

__all__ = ["JobCancelled", "RunningJob", "current_job"]


class JobCancelled(UnrecoverableError):
    """What a cancelled job's handler ends with (the server already dead-lettered the job
    with this reason; no retry)."""


class RunningJob:
    """The job of the running handler: the pulled `job`, and its cancellation."""

    __slots__ = ("_cancelled", "_event", "_task", "job", "reason")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.reason: str | None = None  # the server's failedReason once cancelled
        self._cancelled = False
        # Made on the first `wait_cancelled` only: an Event costs more than the rest of a
        # job's bookkeeping, and one is made per job.
        self._event: threading.Event | None = None
        self._task: asyncio.Task[Any] | None = None

    def __repr__(self) -> str:
        return f"<RunningJob {self.job.name} {self.job.id} cancelled={self.cancelled}>"

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def data(self) -> Any:
        return self.job.data

    @property
    def cancelled(self) -> bool:
        """True once the server said this job was cancelled: stop and return (or raise)."""
        return self._cancelled

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block until the job is cancelled or `timeout` seconds pass; `cancelled`. A sync
        handler can sleep on this instead of `time.sleep`."""
        with _EVENT_LOCK:
            if self._event is None:
                self._event = threading.Event()
                if self._cancelled:
                    self._event.set()
            event = self._event
        return event.wait(timeout)

    def raise_if_cancelled(self) -> None:
        """Raise `JobCancelled` if the job was cancelled."""
        if self._cancelled:
            raise JobCancelled(self.reason or "cancelled")

    def bind_task(self, task: asyncio.Task[Any] | None) -> None:
        """The asyncio task that runs this job's coroutine (cancelled with the job)."""
        self._task = task
        if task is not None and self._cancelled:
            task.cancel(self.reason)

    def cancel(self, reason: str | None) -> None:
        """Mark the job cancelled; on the worker's loop (the task is cancelled there)."""
        self.reason = reason or "cancelled"
        with _EVENT_LOCK:
            self._cancelled = True
            if self._event is not None:
                self._event.set()
        task = self._task
        if task is not None and not task.done():
            task.cancel(self.reason)


_EVENT_LOCK = threading.Lock()  # makes or sets a job's Event (rare: waits and cancels only)

_CURRENT: contextvars.ContextVar[RunningJob | None] = contextvars.ContextVar(
    "shardq_current_job", default=None
)


def current_job() -> RunningJob:
    """The job the calling handler runs (`job.id`, `job.data`, `cancelled` ...).

    Raises:
        RuntimeError: called outside a job handler of a shardq worker.
    """
    running = _CURRENT.get()
    if running is None:
        raise RuntimeError("current_job() is called outside a job handler of a shardq worker")
    return running


def running_job() -> RunningJob | None:
    """The calling handler's job, or None outside a handler."""
    return _CURRENT.get()


def enter(running: RunningJob | None) -> contextvars.Token[RunningJob | None]:
    return _CURRENT.set(running)


def leave(token: contextvars.Token[RunningJob | None]) -> None:
    _CURRENT.reset(token)
