"""Test plumbing: run every client test over TCP and ZeroMQ, with the blocking and the
asyncio client, against the real server.

Tests are written once, in blocking style, against `clients.queue(...)` and
`clients.worker(...)`. In "sync" mode those are `Queue` and `Worker`; in "async" mode they are
`AsyncQueue` and `AsyncWorker` driven on an event loop in a thread (a portal, as anyio's
`BlockingPortal`), so the asyncio code paths run for real while the test reads the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, ClassVar, TypeVar

import zmq

from shardq.client import AsyncQueue, AsyncWorker, Queue, Worker, WorkerStats

__all__ = ["Clients", "Portal", "queue_name", "wait_until"]

T = TypeVar("T")
CALL_TIMEOUT_S = 60.0  # a portal call that takes longer is a hang: fail, do not wait forever


def queue_name() -> str:
    """A fresh queue name, so tests sharing a server never see each other's jobs."""
    return f"t-{uuid.uuid4().hex[:12]}"


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Poll `condition` until truthy (returned); AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or condition}")
        time.sleep(0.01)


class Portal:
    """An event loop in a daemon thread that runs coroutines for blocking test code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        async def leftovers() -> int:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return len(tasks)

        left = self.call(leftovers())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
        assert left == 0, f"{left} asyncio task(s) outlived their client"


class PortalQueue:
    """An `AsyncQueue` behind blocking methods (each runs on the portal's loop)."""

    def __init__(self, portal: Portal, queue: AsyncQueue) -> None:
        self._portal = portal
        self.async_queue = queue
        self.name = queue.name

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.async_queue, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        return lambda *args, **kwargs: self._portal.call(attr(*args, **kwargs))


class PortalWorker:
    """An `AsyncWorker` behind the blocking `Worker` surface used by the tests."""

    def __init__(self, portal: Portal, worker: AsyncWorker) -> None:
        self._portal = portal
        self.async_worker = worker
        self._run: Future[WorkerStats] | None = None

    @property
    def stats(self) -> WorkerStats:
        return self.async_worker.stats

    def start(self) -> PortalWorker:
        self._run = self._portal.spawn(self.async_worker.run())
        return self

    def run_until_idle(self, timeout: float | None = None) -> WorkerStats:
        return self._portal.call(self.async_worker.run_until_idle(timeout))

    def close(self, grace: float | None = None) -> WorkerStats:
        stats = self._portal.call(self.async_worker.close(grace))
        if self._run is not None:
            self._run.result(CALL_TIMEOUT_S)  # raises what stopped the worker
        return stats


class Clients:
    """Makes queues and workers for one transport and mode; closes them all at the end."""

    # Short long-polls: a ZeroMQ worker's close waits out its pending poll.
    WORKER_DEFAULTS: ClassVar[dict[str, Any]] = {"poll_timeout_ms": 300, "timeout": 5.0}

    def __init__(self, transport: str, mode: str, tcp: tuple[str, int], zmq_port: int) -> None:
        self.transport = transport
        self.mode = mode
        host, port = tcp
        self.url = f"tcp://{host}:{port}" if transport == "tcp" else f"zmq://{host}:{zmq_port}"
        self.portal = Portal() if mode == "async" else None
        self._closers: list[Callable[[], Any]] = []

    def queue(self, name: str | None = None, **options: Any) -> Any:
        """A `Queue` (sync) or a blocking view of an `AsyncQueue` (async)."""
        name = name or queue_name()
        options.setdefault("timeout", 5.0)
        if self.portal is None:
            queue = Queue(name, url=self.url, **options)
            self._closers.append(queue.close)
            return queue
        view = PortalQueue(self.portal, AsyncQueue(name, url=self.url, **options))
        self._closers.append(view.close)
        return view

    def worker(self, queue: str, handler: Callable[..., Any], **options: Any) -> Any:
        """A `Worker` (sync) or a blocking view of an `AsyncWorker` (async), not started."""
        options = {"url": self.url, **self.WORKER_DEFAULTS, **options}
        if self.portal is None:
            worker = Worker(queue, handler, **options)
            self._closers.append(lambda: worker.close(grace=1.0))
            return worker
        view = PortalWorker(self.portal, AsyncWorker(queue, handler, **options))
        self._closers.append(lambda: view.close(grace=1.0))
        return view

    def close(self) -> None:
        errors: list[BaseException] = []
        for close in reversed(self._closers):
            try:
                close()
            except Exception as e:  # report the first, close the rest
                errors.append(e)
        if self.portal is not None:
            self.portal.close()
        if errors:
            raise errors[0]


@contextlib.contextmanager
def silent_server(kind: str) -> Any:
    """A listener that accepts and never answers: a raw TCP socket or a ZeroMQ ROUTER.
    Yields the URL to connect to."""
    if kind == "tcp":
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen(16)
            yield f"tcp://127.0.0.1:{sock.getsockname()[1]}"
        return
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        yield f"zmq://127.0.0.1:{port}"
    finally:
        router.close(linger=0)
        ctx.term()
