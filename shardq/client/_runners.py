"""Where a worker's handlers run: `AsyncRunner` on the event loop, `ThreadRunner` in threads.

Both hold the prefetch buffer (jobs pulled and not started) and run `concurrency` handlers at
once, each one taking the next job from the buffer as soon as it is free: no task, future or
thread hand-off per job.

- `AsyncRunner`: `concurrency` long-lived tasks on the worker's loop, each awaiting one async
  handler at a time. A handler that never suspends would starve the loop (pulls, heartbeats),
  so a task yields once every `YIELD_EVERY` jobs.
- `ThreadRunner`: `concurrency` dedicated threads for sync handlers, taking jobs from a
  `queue.SimpleQueue`. Outcomes come back through a deque; the loop is woken once per batch
  of outcomes, not once per job.

Before a job starts, `gate(lease)` must say its lease is still surely the worker's; a job
that fails the gate is reported `SKIPPED` and not run. Every outcome is reported, on the
loop, with `on_done(lease, outcome, value)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

from shardq.client._current import JobCancelled, RunningJob, enter, leave
from shardq.client._models import Job
from shardq.client._worker_state import Lease

__all__ = ["AsyncRunner", "Outcome", "Runner", "ThreadRunner"]

YIELD_EVERY: Final = 16  # jobs an async runner task runs before it lets the loop in


class Outcome(enum.Enum):
    OK = "ok"  # value: the handler's result
    ERROR = "error"  # value: the exception it raised
    SKIPPED = "skipped"  # not run: its lease could have lapsed (value None)


Gate = Callable[[Lease], bool]
OnDone = Callable[[Lease, Outcome, Any], None]


class Runner(Protocol):
    """What `AsyncWorker` needs from a runner."""

    @property
    def waiting(self) -> int:
        """Jobs in the buffer, not started yet."""
        ...

    def start(self) -> None: ...

    def submit(self, leases: Iterable[Lease]) -> None:
        """Add pulled jobs to the buffer."""
        ...

    def take_waiting(self) -> list[Lease]:
        """Empty the buffer: its jobs will not start here (the worker gives them back)."""
        ...

    async def stop(self, grace: float) -> bool:
        """Start no more jobs; wait up to `grace` seconds for running handlers. True if some
        were still running (async ones are cancelled; a thread cannot be stopped)."""
        ...


class AsyncRunner:
    """Async handlers, `concurrency` at a time, as tasks on the running loop."""

    def __init__(
        self, handler: Callable[[Job], Any], concurrency: int, gate: Gate, on_done: OnDone
    ) -> None:
        self._handler = handler
        self._concurrency = concurrency
        self._gate = gate
        self._on_done = on_done
        self._buffer: deque[Lease] = deque()
        self._parked: deque[asyncio.Future[None]] = deque()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    @property
    def waiting(self) -> int:
        return len(self._buffer)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._serve(), name=f"shardq-handler-{i}")
            for i in range(self._concurrency)
        ]

    def submit(self, leases: Iterable[Lease]) -> None:
        self._buffer.extend(leases)
        for _ in range(min(len(self._buffer), len(self._parked))):
            parked = self._parked.popleft()
            if not parked.done():
                parked.set_result(None)

    def take_waiting(self) -> list[Lease]:
        taken = list(self._buffer)
        self._buffer.clear()
        return taken

    async def stop(self, grace: float) -> bool:
        self._stopping = True
        while self._parked:
            parked = self._parked.popleft()
            if not parked.done():
                parked.set_result(None)
        pending: set[asyncio.Task[None]] = {t for t in self._tasks if not t.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return bool(pending)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        buffer, gate, on_done, handler = self._buffer, self._gate, self._on_done, self._handler
        ran = 0
        while not self._stopping:
            if not buffer:
                parked: asyncio.Future[None] = loop.create_future()
                self._parked.append(parked)
                await parked
                continue
            lease = buffer.popleft()
            if not gate(lease):
                on_done(lease, Outcome.SKIPPED, None)
                continue
            lease.started = True
            # The handler runs inline in this task (no task per job): a cancel pushed by
            # the server cancels this task while it waits inside the handler, and the
            # CancelledError is taken back here (`uncancel`) so the runner goes on.
            running = lease.running = RunningJob(lease.job)
            running.bind_task(me)
            token = enter(running)
            try:
                result = await handler(lease.job)
            except asyncio.CancelledError:
                if not running.cancelled:
                    raise
                on_done(lease, Outcome.ERROR, JobCancelled(running.reason or "cancelled"))
            except Exception as e:
                on_done(lease, Outcome.ERROR, e)
            else:
                on_done(lease, Outcome.OK, result)
            finally:
                running.bind_task(None)
                leave(token)
                if running.cancelled and me is not None and me.cancelling():
                    me.uncancel()  # the job's cancel, not the runner's
            ran += 1
            if ran >= YIELD_EVERY:
                ran = 0
                await asyncio.sleep(0)


_STOP: Final = None  # what a handler thread takes from its inbox to exit


class ThreadRunner:
    """Sync handlers in `concurrency` dedicated threads (daemon threads: a worker that is
    never closed does not keep the process alive; close it to let handlers finish)."""

    def __init__(
        self,
        handler: Callable[[Job], Any],
        concurrency: int,
        gate: Gate,
        on_done: OnDone,
        name: str,
    ) -> None:
        self._handler = handler
        self._gate = gate
        self._on_done = on_done
        self._inbox: queue.SimpleQueue[Lease | None] = queue.SimpleQueue()
        self._outcomes: deque[tuple[Lease, Outcome, Any]] = deque()
        self._wake_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
            for i in range(concurrency)
        ]
        self._exited = 0
        self._all_exited: asyncio.Future[None] | None = None

    @property
    def waiting(self) -> int:
        return self._inbox.qsize()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._all_exited = self._loop.create_future()
        for thread in self._threads:
            thread.start()

    def submit(self, leases: Iterable[Lease]) -> None:
        put = self._inbox.put
        for lease in leases:
            put(lease)

    def take_waiting(self) -> list[Lease]:
        taken: list[Lease] = []
        while True:
            try:
                lease = self._inbox.get_nowait()
            except queue.Empty:
                return taken
            if lease is not None:
                taken.append(lease)

    async def stop(self, grace: float) -> bool:
        for _ in self._threads:
            self._inbox.put(_STOP)
        assert self._all_exited is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await asyncio.shield(self._all_exited)
        self._deliver()  # outcomes reported just before the last thread exited
        return not self._all_exited.done()

    # -- in the handler threads ------------------------------------------------------------

    def _serve(self) -> None:
        get, gate, handler, report = self._inbox.get, self._gate, self._handler, self._report
        try:
            while (lease := get()) is not _STOP:
                if not gate(lease):
                    report(lease, Outcome.SKIPPED, None)
                    continue
                lease.started = True
                running = lease.running = RunningJob(lease.job)
                token = enter(running)
                try:
                    result = handler(lease.job)
                except Exception as e:
                    report(lease, Outcome.ERROR, e)
                else:
                    report(lease, Outcome.OK, result)
                finally:
                    leave(token)
        finally:
            self._call_on_loop(self._thread_exited)

    def _report(self, lease: Lease, outcome: Outcome, value: Any) -> None:
        self._outcomes.append((lease, outcome, value))
        # The loop drains every outcome queued before it runs `_deliver`; a thread that finds
        # a wake-up already scheduled needs none of its own.
        if not self._wake_scheduled:
            self._wake_scheduled = True
            self._call_on_loop(self._deliver)

    def _call_on_loop(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(callback)

    # -- on the loop -----------------------------------------------------------------------

    def _deliver(self) -> None:
        self._wake_scheduled = False
        outcomes, on_done = self._outcomes, self._on_done
        while outcomes:
            on_done(*outcomes.popleft())

    def _thread_exited(self) -> None:
        self._exited += 1
        done = self._all_exited
        if self._exited == len(self._threads) and done is not None and not done.done():
            done.set_result(None)
