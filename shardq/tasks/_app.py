"""`App` and `Task`: decorate a function, call `.delay()` to run it on a worker later.

    app = shardq.App(url="tcp://127.0.0.1:6789")

    @app.task(queue="emails", attempts=5, backoff=2.0)
    def send_email(to: str) -> str: ...

    result = send_email.delay("a@b.c")      # a job named after the task, on queue "emails"
    result.get(timeout=10)                  # its return value, or TaskFailed

A call becomes one job: its name is the task's name and its data `{"args": [...], "kwargs":
{...}}`, so any bunqueue client can enqueue a task too. Producing goes through one
`shardq.client.Connection` per process, shared by the app's queues (opened at the first call,
opened again in a forked child, which must not share its parent's socket).
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, Unpack, overload

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.client import DEFAULT_URL, Connection, Queue, SerializationError
from shardq.tasks._canvas import Signature
from shardq.tasks._options import (
    CallOptions,
    TaskOptions,
    UniqueKey,
    encode_payload,
    encode_payloads,
)
from shardq.tasks._periodic import Schedule
from shardq.tasks._result import EagerResult, TaskFailed, TaskResult

__all__ = ["App", "Task"]

P = ParamSpec("P")
R = TypeVar("R")

_forks = 0
"""How many times this process is a forked child of a process that imported this module."""


def _count_fork() -> None:
    global _forks
    _forks += 1


# os.fork and multiprocessing run this in the child (a fork made behind Python's back, from C
# without `PyOS_AfterFork_Child`, is not seen; then the child must call `App.close()` first).
os.register_at_fork(after_in_child=_count_fork)


class Task(Generic[P, R]):
    """A function registered with `App.task`. Calling it runs the function here and now;
    `delay` and `apply` enqueue a job for a worker instead."""

    def __init__(self, app: App, fn: Callable[P, R], name: str, options: TaskOptions) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.options = options
        self.is_async = inspect.iscoroutinefunction(fn)
        # The PUSH fields every `.delay()` sends (None when a `unique_key` function makes
        # them depend on the arguments): `delay` goes straight to `Queue.add` with them.
        self._wire = None if callable(options.unique_key) else options.wire((), {}, None)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.options.queue!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> TaskResult:
        """Enqueue a call with the task's options; return its handle.

        Raises:
            SerializationError: an argument msgpack cannot encode (nothing was sent).
            ServerError, ConnectionLost, CommandTimeout: as `Queue.add` raises them.
        """
        # `apply` without its per-call options: no merge, no copy of the arguments, no wire
        # fields to look up; the same job, for the client CPU of a bare `Queue.add`.
        wire, app = self._wire, self.app
        if wire is None or app.eager:
            return self.apply(args, kwargs)
        queue = app._queues.get(self.options.queue)
        if queue is None or app._forks != _forks:  # `App.queue`'s own check, without a call
            queue = app.queue(self.options.queue)
        try:
            new_id = queue.add(self.name, {"args": list(args), "kwargs": kwargs}, wire)
        except SerializationError:
            encode_payload(self.name, args, kwargs)  # names the argument (see `apply`)
            raise
        return TaskResult(queue, new_id, self.name)

    def apply(
        self,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[CallOptions],
    ) -> TaskResult:
        """Enqueue a call with per-call `options` (those of `@app.task`, plus `job_id`: a
        custom id that makes the call idempotent). Raises what `delay` raises, and
        `TypeError` for an unknown option."""
        kwargs = dict(kwargs or {})
        opts, job_id = self.options.merged(options)
        if self.app.eager:
            return self.app._run_eagerly(self, encode_payload(self.name, args, kwargs), job_id)
        queue = self.app.queue(opts.queue)
        wire = opts.wire(args, kwargs, job_id)
        try:
            new_id = queue.add(self.name, {"args": list(args), "kwargs": kwargs}, wire)
        except SerializationError:
            # The client encodes the PUSH before it sends anything; encoding the payload a
            # second time up front, only to name a bad argument, cost every call a msgpack
            # pass. Now only a refused call pays it, to say which argument it was.
            encode_payload(self.name, args, kwargs)
            raise  # the arguments encode: the PUSH was refused for its size or its options
        return TaskResult(queue, new_id, self.name)

    def map(self, calls: Iterable[Any], **options: Unpack[CallOptions]) -> list[TaskResult]:
        """Enqueue one call per item of `calls` (a tuple of positional arguments, or any
        other value as the only argument, as huey's `map`), sent in bulk (PUSHB of up to 1000
        jobs); their handles in order. Options as for `apply`, for every call; a `job_id`
        is refused (one id cannot name several jobs).

        Raises what `delay` raises; an unencodable argument refuses the whole batch before
        anything is sent. A refusal of the server raises after earlier chunks were accepted.
        """
        opts, job_id = self.options.merged(options)
        if job_id is not None:
            raise TypeError("map() takes no job_id: one id cannot name several jobs")
        argument_lists = [call if isinstance(call, tuple) else (call,) for call in calls]
        payloads = encode_payloads(self.name, argument_lists)
        # Wire fields, not `JobOptions`: the bulk encoder would translate those once per job.
        shared = None if callable(opts.unique_key) else opts.wire((), {}, None)
        jobs = [
            (self.name, payload, shared if shared is not None else opts.wire(args, {}, None))
            for args, payload in zip(argument_lists, payloads, strict=True)
        ]
        if self.app.eager:
            return [self.app._run_eagerly(self, payload, None) for _, payload, _ in jobs]
        queue = self.app.queue(opts.queue)
        return [TaskResult(queue, i, self.name) for i in queue.add_bulk(jobs)]

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature: this call, not sent yet, for `chain`, `group` and `chord` (or its
        own `.delay()`). Per-call options go through `.set(queue=..., ...)`."""
        return Signature(self, args, kwargs, {})


class App:
    """A registry of tasks and the connection their calls are sent on.

    `url` is `tcp://host:port` or `zmq://host:port`; `token` an auth token. With
    `eager=True` nothing is sent: `.delay()` runs the task in this process at once (the
    arguments and result still go through msgpack, as they would on a worker), for unit
    tests, as Celery's `task_always_eager`. `queue` is the default queue of the tasks.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        eager: bool = False,
        queue: str = "default",
        timeout: float = 10.0,
    ) -> None:
        self.url = url
        self.token = token
        self.eager = eager
        self.default_queue = queue
        self.timeout = timeout
        self.tasks: dict[str, Task[..., Any]] = {}
        self.schedules: dict[str, Schedule] = {}
        self._lock = threading.Lock()
        self._pid = -1
        self._forks = -1  # `_forks` when `_queues` was last checked against the pid
        self._connection: Connection | None = None
        self._queues: dict[str, Queue] = {}

    def __repr__(self) -> str:
        return f"App({self.url!r}, tasks={len(self.tasks)})"

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def queues(self) -> list[str]:
        """The queues of the registered tasks, sorted."""
        return sorted({task.options.queue for task in self.tasks.values()})

    # -- registering ------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        attempts: int | None = None,
        backoff: float | None = None,
        timeout: float | None = None,
        priority: int | None = None,
        durable: bool | None = None,
        unique_key: UniqueKey | None = None,
        delay: float | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        attempts: int | None = None,
        backoff: float | None = None,
        timeout: float | None = None,
        priority: int | None = None,
        durable: bool | None = None,
        unique_key: UniqueKey | None = None,
        delay: float | None = None,
    ) -> Any:
        """Register a sync or async function as a task; usable bare (`@app.task`) or with
        options (`@app.task(queue="emails", attempts=5)`, see `TaskOptions`). `name`
        defaults to `module.qualname`.

        Raises:
            ValueError: an option out of range, or a name already registered.
        """
        opts = TaskOptions(
            queue=queue or self.default_queue, attempts=attempts, backoff=backoff,
            timeout=timeout, priority=priority, durable=durable, unique_key=unique_key,
            delay=delay,
        )  # fmt: skip

        def register(func: Callable[P, R]) -> Task[P, R]:
            task = Task(self, func, name or _default_name(func), opts)
            with self._lock:
                if task.name in self.tasks:
                    raise ValueError(f"a task named {task.name!r} is already registered")
                self.tasks[task.name] = task
            return task

        return register if fn is None else register(fn)

    def periodic(
        self,
        cron: str | None = None,
        *,
        tz: str | None = None,
        every: float | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Callable[[Task[P, R]], Task[P, R]]:
        """Run a task on a schedule, stacked on `@app.task`: a cron expression (5 fields, or 6
        with seconds first) read in time zone `tz` (UTC by default), or `every` seconds; the
        task is called with `args` and `kwargs`. `shardq worker` writes the schedule to the
        server when it starts (docs/tasks.md); the server fires each slot at most once.

        Raises:
            ValueError: both or neither of `cron` and `every`, an invalid expression or
                zone, a task already periodic.
            TypeError: the decorated object is not a task of this app.
        """
        schedule = Schedule(cron, tz, every, tuple(args), dict(kwargs or {}))
        encode_payload("app.periodic", schedule.args, schedule.kwargs)  # refuse bad arguments now

        def register(task: Task[P, R]) -> Task[P, R]:
            if not isinstance(task, Task) or self.tasks.get(task.name) is not task:
                raise TypeError(
                    f"@app.periodic(...) goes above @app.task(...) of the same app, got {task!r}"
                )
            with self._lock:
                if task.name in self.schedules:
                    raise ValueError(f"task {task.name!r} already has a schedule")
                self.schedules[task.name] = schedule
            return task

        return register

    # -- producing --------------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        """The `Queue` named `name` on this app's connection (for counts, the DLQ, ...)."""
        # Every `.delay()` comes here: a queue already opened in this process is taken
        # without the lock (a dict read is atomic; `close` swaps in a new dict). Whether this
        # is still the process that opened it is told by the fork count, not `os.getpid()`:
        # a system call on every `.delay()`.
        found = self._queues.get(name)
        if found is not None and self._forks == _forks:
            return found
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child
                self._connection = None
                self._queues = {}
                self._pid = os.getpid()
            self._forks = _forks
            if self._connection is None:
                self._connection = Connection(self.url, token=self.token, timeout=self.timeout)
            found = self._queues.get(name)
            if found is None:
                found = self._queues[name] = Queue(name, connection=self._connection)
            return found

    def result(self, job_id: str, task: str = "", queue: str | None = None) -> TaskResult:
        """A handle on a job enqueued earlier (e.g. by another process), by id. `task`
        names it in errors (by default a failure names the job's own name)."""
        return TaskResult(self.queue(queue or self.default_queue), job_id, task)

    def close(self) -> None:
        """Close this process's connection (a later call opens a new one). Idempotent."""
        with self._lock:
            # The queues go first: `queue` reads them without the lock, and must not hand
            # out one whose connection is already closed.
            self._queues = {}
            connection, self._connection = self._connection, None
            if connection is not None and self._pid == os.getpid():
                connection.close()

    def _run_eagerly(
        self, task: Task[..., Any], payload: dict[str, Any], job_id: str | None
    ) -> EagerResult:
        job_id = job_id or f"eager-{uuid.uuid4().hex}"
        call = _round_trip(payload)
        args, kwargs = call["args"], call["kwargs"]
        try:
            value = _call(task.fn, args, kwargs)
            value = _round_trip(value)
        except Exception as e:
            lines = "".join(traceback.format_exception(e)).rstrip().splitlines()
            failure = TaskFailed(task.name, job_id, str(e) or type(e).__name__, lines)
            return EagerResult(job_id, task.name, failure=failure)
        return EagerResult(job_id, task.name, value)


def _round_trip(value: Any) -> Any:
    """`value` as a worker or a result reader would see it (tuples become lists, ...).
    Raises `TypeError` for what msgpack cannot encode (as a worker fails that job)."""
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False)


def _call(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    if not inspect.iscoroutinefunction(fn):
        return fn(*args, **kwargs)
    import asyncio  # here: an app that sends tasks (`.delay()`) need not load it

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(fn(*args, **kwargs))
    # Called from a coroutine (an async test, a FastAPI endpoint): that loop cannot be
    # blocked on, so the task runs to completion on a loop of its own in a helper thread.
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, asyncio.run(fn(*args, **kwargs))))
        except Exception as e:
            box.append((False, e))

    thread = threading.Thread(target=run, name="shardq-eager")
    thread.start()
    thread.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _default_name(fn: Callable[..., Any]) -> str:
    module = fn.__module__
    if module == "__main__":
        # Run as a script, the module is "__main__" here but has its real name in a worker
        # that imports it: use that name, so both sides agree.
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        path = getattr(main, "__file__", None) or ""
        module = spec.name if spec is not None else os.path.splitext(os.path.basename(path))[0]
    return f"{module}.{fn.__qualname__}"
