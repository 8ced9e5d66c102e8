"""`shardq worker module:app`: run every task of an app, in one or several processes.

Each process runs one `AsyncWorker` per queue on one event loop (so the SDK's prefetch,
batched ACKs, lease heartbeats and reconnects apply): a queue whose tasks are all sync gets a
`SyncDispatcher`, run in the SDK worker's own threads; a queue with async tasks gets a
`Dispatcher` on the loop, with a thread pool for its sync tasks. With `processes > 1` the
command forks that many children after importing the app (Celery's prefork, arq's and
dramatiq's worker processes) and supervises them:

- the first SIGTERM or SIGINT stops pulling, gives the prefetched jobs back to the queue and
  lets the running ones finish (up to `grace` seconds), then flushes the ACKs and exits 0;
- a second one exits at once (status 1): jobs still running are delivered again once their
  lease lapses (at-least-once).

Children ignore SIGINT: a Ctrl+C reaches the whole foreground process group, and the parent
turns it into exactly one SIGTERM per child, so one Ctrl+C never counts as two signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, Final, NoReturn, TextIO

import structlog

from shardq.client import AsyncWorker, WorkerStats
from shardq.client._worker_config import DEFAULT_PREFETCH, MAX_PREFETCH
from shardq.errors import ShardqError
from shardq.tasks._app import App
from shardq.tasks._dispatch import DONE, FAILED, Counters, Dispatcher, SyncDispatcher
from shardq.tasks._periodic import ScheduleWriter

__all__ = ["WorkerSettings", "exit_now", "load_app", "run"]

STATUS_INTERVAL_S: Final = 0.5
CHILD_POLL_S: Final = 0.1
EXIT_NOW: Final = 1
TASK_PREFETCH_MAX: Final = 256  # bench.task_drain: 512 drained no faster, and hoards more

_log = structlog.get_logger("shardq.tasks")


class AppNotFound(Exception):
    """`module:attribute` does not name an importable `shardq.App`."""


@dataclass(frozen=True)
class WorkerSettings:
    """What `shardq worker` was told; `ValueError` names a setting out of range."""

    queues: tuple[str, ...] = ()  # empty: every queue of the app's tasks
    concurrency: int = 4  # per queue: a few I/O-bound tasks at once without a thread storm
    processes: int = 1
    # Per queue and process: the SDK's buffer, grown up to `prefetch_max` while the tasks
    # finish faster than a pull's round trip (a queue of quick tasks is pulled in batches of
    # up to about 130 instead of 40: a fifth less CPU a job in the server and the worker).
    prefetch: int = DEFAULT_PREFETCH
    prefetch_max: int | None = None  # None: TASK_PREFETCH_MAX, or `prefetch` if above it
    grace: float = 30.0  # bunqueue's SHUTDOWN_TIMEOUT_MS default
    url: str | None = None  # default: the app's
    log_format: str = "json"
    log_level: str = "info"

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.processes < 1:
            raise ValueError(f"--processes must be >= 1, got {self.processes}")
        if not 0 <= self.prefetch <= MAX_PREFETCH:
            raise ValueError(f"--prefetch must be in 0..{MAX_PREFETCH}, got {self.prefetch}")
        if self.prefetch_max is not None and not (
            self.prefetch <= self.prefetch_max <= MAX_PREFETCH
        ):
            raise ValueError(f"--prefetch-max must be in --prefetch ({self.prefetch})"
                             f"..{MAX_PREFETCH}, got {self.prefetch_max}")  # fmt: skip
        if self.grace < 0:
            raise ValueError(f"--grace must be >= 0 seconds, got {self.grace}")

    @property
    def buffer_max(self) -> int:
        """The most a worker's prefetch grows to (`prefetch_max` in force)."""
        if self.prefetch_max is not None:
            return self.prefetch_max
        return max(self.prefetch, TASK_PREFETCH_MAX)


def load_app(spec: str) -> App:
    """Import `module:attribute` (the current directory first on the path, as `python -m`
    does) and return the `App` it names.

    Raises:
        AppNotFound: the module or attribute is missing, or is not an `App`.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name:
        raise AppNotFound(f"expected module:app, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise AppNotFound(f"cannot import {module_name!r}: {e}") from e
    app = getattr(module, attribute or "app", None)
    if not isinstance(app, App):
        raise AppNotFound(f"{spec!r} is not a shardq.App (got {type(app).__name__})")
    return app


def run(app: App, settings: WorkerSettings, *, status: TextIO | None = None) -> int:
    """Serve the app's tasks until a signal stops it; the exit status.

    `status` is where a live one-line status goes (when it is a terminal).

    A sync task still running when the grace is over keeps a thread of this process
    busy; the caller should leave with `exit_now` (its job was given back to the queue).

    Raises:
        ValueError: the app has no task.
    """
    queues = settings.queues or tuple(app.queues)
    if not queues:
        raise ValueError("the app registers no task: there is nothing to run")
    missing = sorted(set(queues) - set(app.queues))
    if missing:
        _log.warning("no task of the app uses these queues", queues=missing)
    ctx = multiprocessing.get_context("fork")
    counters = ctx.Array("q", 2 * settings.processes, lock=False)
    started = time.monotonic()
    _log.info("worker starting", queues=list(queues), processes=settings.processes,
              concurrency=settings.concurrency, tasks=sorted(app.tasks))  # fmt: skip
    # Once per `shardq worker`, in this process (children would not need a connection each);
    # a server that cannot be reached yet is tried again in a thread, started after the fork.
    writer = ScheduleWriter(app, queues, settings.url)
    try:
        written = writer.write()
    except ShardqError as e:
        _log.error("the server refused the periodic tasks' schedules",
                   error=f"{type(e).__name__}: {e}")  # fmt: skip
        return 1
    line = _StatusLine(counters, status, started) if status is not None else None
    if settings.processes == 1:
        if not written:
            writer.keep_trying()
        with _running(line):
            code = serve(app, queues, settings, _Slot(counters, 0), child=False)
    else:
        code = _supervise(app, queues, settings, counters, line,
                          None if written else writer.keep_trying)  # fmt: skip
    writer.stop()
    _log.info("worker stopped", done=_total(counters, DONE), failed=_total(counters, FAILED))
    return code


# -- one process -----------------------------------------------------------------------------


class _Slot:
    """One process's [done, failed] inside the shared counters array."""

    def __init__(self, counters: Any, index: int) -> None:
        self._counters = counters
        self._base = 2 * index

    def __getitem__(self, index: int) -> int:
        return int(self._counters[self._base + index])

    def __setitem__(self, index: int, value: int) -> None:
        self._counters[self._base + index] = value


def serve(
    app: App, queues: Sequence[str], settings: WorkerSettings, counters: Counters, *, child: bool
) -> int:
    """Run a worker per queue in this process until a signal; the exit status."""
    if child:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards it (module doc)
    try:
        return asyncio.run(_serve(app, queues, settings, counters, child=child))
    except ShardqError as e:
        # A permanent refusal (a bad token, a queue name the server rejects): the workers
        # have shut down; say why in one line instead of a traceback.
        _log.error("worker failed", error=f"{type(e).__name__}: {e}")
        return 1


async def _serve(
    app: App, queues: Sequence[str], settings: WorkerSettings, counters: Counters, *, child: bool
) -> int:
    executor = ThreadPoolExecutor(settings.concurrency * len(queues), "shardq-task")
    dispatcher = Dispatcher(app.tasks, executor, counters)
    workers = [
        AsyncWorker(q, _handler(app, q, dispatcher, counters), concurrency=settings.concurrency,
                    url=settings.url or app.url, token=app.token, close_grace=settings.grace,
                    prefetch=settings.prefetch, prefetch_max=settings.buffer_max)
        for q in queues
    ]  # fmt: skip
    stopping = _Stopper(workers)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM,) if child else (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.signal, sig)
    _log.info("worker process ready", queues=list(queues), concurrency=settings.concurrency)
    try:
        stats = await asyncio.gather(*(worker.run() for worker in workers))
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
    _log.info("process stopped", **_summary(stats))
    return 0


def _handler(app: App, queue: str, dispatcher: Dispatcher, counters: Counters) -> Any:
    """The handler of `queue`'s worker: the sync one when every task sent there by default is
    sync (the common case, and the fast one), else the loop's."""
    if all(not t.is_async for t in app.tasks.values() if t.options.queue == queue):
        return SyncDispatcher(app.tasks, counters, dispatcher, asyncio.get_running_loop())
    return dispatcher


class _Stopper:
    def __init__(self, workers: list[AsyncWorker]) -> None:
        self._workers = workers
        self._signals = 0
        self._closing: list[asyncio.Task[WorkerStats]] = []  # referenced, so not collected

    def signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals > 1:
            _log.warning("second signal: stopping at once", signal=signal.Signals(sig).name)
            os._exit(EXIT_NOW)  # no grace: running jobs are delivered again after their lease
        _log.info("stopping: finishing running jobs, giving prefetched ones back",
                  signal=signal.Signals(sig).name)  # fmt: skip
        self._closing = [asyncio.ensure_future(w.close()) for w in self._workers]


def _summary(stats: Sequence[WorkerStats]) -> dict[str, int]:
    keys = ("processed", "failed", "released", "lost", "expired")
    return {key: sum(int(getattr(s, key)) for s in stats) for key in keys}


# -- several processes -----------------------------------------------------------------------


def _supervise(
    app: App,
    queues: Sequence[str],
    settings: WorkerSettings,
    counters: Any,
    line: _StatusLine | None,
    after_fork: Callable[[], None] | None = None,
) -> int:
    ctx = multiprocessing.get_context("fork")
    children: list[BaseProcess] = []
    for index in range(settings.processes):
        child = ctx.Process(
            target=_child_main,
            args=(app, queues, settings, _Slot(counters, index), index),
            name=f"shardq-worker-{index}",
        )
        child.start()
        children.append(child)
    if after_fork is not None:
        after_fork()
    forwarded = 0

    def forward(sig: int, _frame: object) -> None:
        nonlocal forwarded
        forwarded += 1
        for child in children:
            if child.pid is not None and child.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    with _running(line):
        code = _wait_children(children, lambda: forwarded > 0)
    return code


def _child_main(
    app: App, queues: Sequence[str], settings: WorkerSettings, counters: _Slot, index: int
) -> None:
    from shardq._logging import configure

    configure("worker", settings.log_format, settings.log_level, index)
    exit_now(serve(app, queues, settings, counters, child=True))


def exit_now(code: int) -> NoReturn:
    """Leave the process without joining its threads: a sync task that outran the grace
    cannot be interrupted, and the interpreter's exit would wait for it (its job was already
    given back, and runs again elsewhere)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _wait_children(children: list[BaseProcess], stopping: Callable[[], bool]) -> int:
    """Wait until every child exits; one that dies before a stop was asked stops the rest
    (a half-staffed worker would hide the failure). The worst exit status."""
    stopped_others = False
    while any(child.exitcode is None for child in children):
        for child in children:
            child.join(CHILD_POLL_S)
            if child.exitcode is not None and not stopping() and not stopped_others:
                _log.error("worker process exited", child=child.name, exitcode=child.exitcode)
                stopped_others = True
                for other in children:
                    if other.pid is not None and other.exitcode is None:
                        os.kill(other.pid, signal.SIGTERM)
    codes = [abs(child.exitcode or 0) for child in children]
    return max([1 if stopped_others else 0, *codes])


# -- the live status line --------------------------------------------------------------------


class _StatusLine:
    """One terminal line, "done 1520  failed 3  412/s", redrawn twice a second."""

    def __init__(self, counters: Any, out: TextIO, started: float) -> None:
        self._counters = counters
        self._out = out
        self._started = started
        self._stop = threading.Event()
        self._last = (started, 0)

    def text(self, now: float) -> str:
        done, failed = _total(self._counters, DONE), _total(self._counters, FAILED)
        then, before = self._last
        rate = (done - before) / (now - then) if now > then else 0.0
        self._last = (now, done)
        return f"shardq worker  done {done}  failed {failed}  {rate:,.0f}/s"

    def run(self) -> None:
        while not self._stop.wait(STATUS_INTERVAL_S):
            self._out.write("\r\x1b[K" + self.text(time.monotonic()))
            self._out.flush()
        self._out.write("\r\x1b[K" + self.text(time.monotonic()) + "\n")
        self._out.flush()

    def stop(self) -> None:
        self._stop.set()


@contextlib.contextmanager
def _running(line: _StatusLine | None) -> Any:
    if line is None:
        yield
        return
    thread = threading.Thread(target=line.run, name="shardq-status", daemon=True)
    thread.start()
    try:
        yield
    finally:
        line.stop()
        thread.join(1.0)


def _total(counters: Any, which: int) -> int:
    return sum(int(counters[i]) for i in range(which, len(counters), 2))
