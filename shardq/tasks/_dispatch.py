"""`Dispatcher`: the one handler a worker runs for a queue, which calls the task a job names.

`Dispatcher` is an async handler, so one `AsyncWorker` per queue serves sync and async tasks
alike: async tasks run on the worker's loop, sync ones in a thread pool, and the worker's
pulls, heartbeats and ACK batches go on meanwhile. `SyncDispatcher` is the sync handler for a
queue whose tasks are all sync: the SDK worker then runs it in its own `concurrency` threads,
with no future and no loop wake-up per job (that hand-off was half of a no-op job's CPU).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any, Protocol

import structlog

from shardq.client import Job, JobCancelled, RunningJob, UnrecoverableError
from shardq.client._current import enter as _enter
from shardq.client._current import running_job
from shardq.tasks._app import Task
from shardq.tasks._canvas import GROUP_TASK, flow_call
from shardq.tasks._options import decode_payload

__all__ = ["Counters", "Dispatcher", "SyncDispatcher", "unknown_task_reason"]

_log = structlog.get_logger("shardq.tasks")


class Counters(Protocol):
    """Where a process counts its jobs: [done, failed] (a shared-memory array with several
    worker processes, so the parent can show a live status line)."""

    def __getitem__(self, index: int) -> int: ...

    def __setitem__(self, index: int, value: int) -> None: ...


DONE, FAILED = 0, 1
KNOWN_SHOWN = 20  # task names a DLQ reason lists: enough to spot a typo, short enough to read


def unknown_task_reason(name: str, known: Mapping[str, object]) -> str:
    """The DLQ reason of a job whose name no task of this worker has."""
    shown = sorted(known)[:KNOWN_SHOWN]
    more = f" and {len(known) - len(shown)} more" if len(known) > len(shown) else ""
    names = ", ".join(shown) or "none"
    return f"no task named {name!r} is registered in this worker (known tasks: {names}{more})"


class Dispatcher:
    """`await dispatcher(job)`: run the task named `job.name` with the job's arguments.

    A job no registered task can run (unknown name, malformed data) raises
    `UnrecoverableError`, so it goes to the DLQ at once with the reason instead of using up
    retries. Each job is logged with its task, job id, attempt and duration.
    """

    def __init__(
        self, tasks: Mapping[str, Task[..., Any]], executor: Executor, counters: Counters
    ) -> None:
        self._tasks = tasks
        self._executor = executor
        self._counters = counters
        # The module's logger is a lazy proxy that builds a new bound logger on every call
        # (the process's logging setup does not cache them): once per job it cost as much as
        # the rest of the dispatch. Bound here, after the worker configured logging.
        self._log = _log.bind()
        self._info = _info_enabled(self._log)

    async def __call__(self, job: Job) -> Any:
        task = self._tasks.get(job.name)
        if task is None and job.name == GROUP_TASK:
            return _collect(job)
        if task is None:
            self._counters[FAILED] += 1
            reason = unknown_task_reason(job.name, self._tasks)
            self._log.error("unknown task", task=job.name, job_id=job.id, queue=job.queue)
            raise UnrecoverableError(reason)
        call = decode_payload(job.data)
        if call is None:
            self._counters[FAILED] += 1
            raise UnrecoverableError(
                f"job data is not a task call ({{'args': [...], 'kwargs': {{...}}}}) for {job.name}"
            )
        args, kwargs = _inputs(job, call[0]), call[1]
        attempt = job.attempts + 1
        started = time.perf_counter()
        try:
            result = await self._run(task, args, kwargs)
        except Exception as e:  # a cancellation (past the grace) is no failure of the task
            duration = round((time.perf_counter() - started) * 1000, 3)
            self._counters[FAILED] += 1
            self._log.warning("task failed", task=task.name, job_id=job.id, attempt=attempt,
                         max_attempts=job.max_attempts, duration_ms=duration,
                         error=f"{type(e).__name__}: {e}")  # fmt: skip
            raise
        self._counters[DONE] += 1
        if self._info:
            duration = round((time.perf_counter() - started) * 1000, 3)
            self._log.info("task done", task=task.name, job_id=job.id, attempt=attempt,
                           duration_ms=duration)  # fmt: skip
        return result

    async def _run(self, task: Task[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        timeout = task.options.timeout
        if task.is_async:
            # The server fails the job at its timeout anyway; stopping the coroutine here too
            # frees the slot for the next job instead of running on for nothing.
            # Worded as the server words its own timeout: whichever of the two fires first
            # under load, the failure reads the same.
            if not timeout:
                return await task.fn(*args, **kwargs)
            timer = asyncio.timeout(timeout)
            try:
                async with timer:
                    return await task.fn(*args, **kwargs)
            except TimeoutError as e:
                if not timer.expired():
                    raise  # the task's own TimeoutError
                raise TimeoutError(f"Job timed out after {round(timeout * 1000)}ms") from e
        loop = asyncio.get_running_loop()
        call = functools.partial(task.fn, *args, **kwargs)
        # In the pool's thread too, `shardq.current_job()` is this job.
        return await loop.run_in_executor(self._executor, contextvars.copy_context().run, call)


class SyncDispatcher:
    """`dispatcher(job)` in one of the SDK worker's handler threads: a sync task runs right
    there; an async one (a call sent to this queue by `apply(queue=...)`) is handed to the
    loop's `Dispatcher` and waited for, so it behaves as anywhere else.

    The counters are shared by the threads, so each update takes a lock (a lost count would
    show in the status line and in the final summary).
    """

    def __init__(
        self,
        tasks: Mapping[str, Task[..., Any]],
        counters: Counters,
        on_loop: Dispatcher,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._tasks = tasks
        self._on_loop = on_loop
        self._loop = loop
        self._counters = _LockedCounters(counters)
        self._log = _log.bind()
        self._info = _info_enabled(self._log)

    def __call__(self, job: Job) -> Any:
        task = self._tasks.get(job.name)
        if task is None or task.is_async:
            # Unknown names too: the loop's dispatcher words the DLQ reason and counts it.
            running = running_job()
            return asyncio.run_coroutine_threadsafe(
                self._in_task(job, running), self._loop
            ).result()
        call = decode_payload(job.data)
        if call is None:
            self._counters.add(FAILED)
            raise UnrecoverableError(
                f"job data is not a task call ({{'args': [...], 'kwargs': {{...}}}}) for {job.name}"
            )
        args, kwargs = _inputs(job, call[0]), call[1]
        started = time.perf_counter()
        try:
            result = task.fn(*args, **kwargs)
        except Exception as e:
            self._counters.add(FAILED)
            self._log.warning("task failed", task=task.name, job_id=job.id,
                              attempt=job.attempts + 1, max_attempts=job.max_attempts,
                              duration_ms=round((time.perf_counter() - started) * 1000, 3),
                              error=f"{type(e).__name__}: {e}")  # fmt: skip
            raise
        self._counters.add(DONE)
        if self._info:  # off (`--log-level warning`): not even the call and its arguments
            duration = round((time.perf_counter() - started) * 1000, 3)
            self._log.info("task done", task=task.name, job_id=job.id,
                           attempt=job.attempts + 1, duration_ms=duration)  # fmt: skip
        return result

    async def _in_task(self, job: Job, running: RunningJob | None) -> Any:
        """The loop's dispatcher in a task of its own, which a cancel of the job cancels
        (and where `shardq.current_job()` is the job, `running`: the handler thread's)."""
        if running is None:
            return await self._on_loop(job)
        _enter(running)
        running.bind_task(asyncio.current_task())
        try:
            return await self._on_loop(job)
        except asyncio.CancelledError:
            if running.cancelled:
                raise JobCancelled(running.reason or "cancelled") from None
            raise
        finally:
            running.bind_task(None)


def _info_enabled(log: Any) -> bool:
    """Whether `log` writes info events (the worker's `--log-level`, set before the
    dispatchers are made); True for a logger that cannot tell."""
    enabled = getattr(log, "is_enabled_for", None)
    return True if enabled is None else bool(enabled(logging.INFO))


def _inputs(job: Job, args: list[Any]) -> list[Any]:
    """The arguments of a call, with the results of the calls it waits for in front (a
    chain's or a chord's, `_canvas`); a malformed flow goes to the DLQ at once."""
    if "flow" not in job.data:  # decode_payload checked it is a mapping
        return args
    try:
        return flow_call(job, args)[0]
    except ValueError as e:
        raise UnrecoverableError(str(e)) from e


def _collect(job: Job) -> Any:
    """A group's collector: the list of its calls' results, in order."""
    try:
        return flow_call(job, [])[0][0]
    except (ValueError, IndexError) as e:
        raise UnrecoverableError(f"{GROUP_TASK} job {job.id}: {e}") from e


class _LockedCounters:
    def __init__(self, counters: Counters) -> None:
        self._counters = counters
        self._lock = threading.Lock()

    def add(self, which: int) -> None:
        with self._lock:
            self._counters[which] += 1
