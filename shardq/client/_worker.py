"""`Worker`: the blocking face of `AsyncWorker`.

A worker is an event loop either way: it multiplexes pulls, batched ACKs and heartbeats on
one connection while handlers run. `Worker` runs that loop in the calling thread (`run`,
`run_until_idle`) or in a thread of its own (`start`), and `close()` may be called from any
thread. Sync handlers run in `concurrency` dedicated threads fed from the prefetch buffer,
async handlers as `concurrency` tasks on the worker's loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Unpack

from shardq.client._async_worker import AsyncWorker, Handler
from shardq.client._url import DEFAULT_URL
from shardq.client._worker_config import WorkerConfig, WorkerOptions
from shardq.client._worker_state import WorkerStats

__all__ = ["Worker"]


class Worker:
    """Runs `handler(job)` for the jobs of `queue`, `concurrency` at a time.

    Options are those of `WorkerConfig` (`prefetch`, `ack_batch`, `lock_ttl_ms`,
    `close_grace`, ...). By default up to 64 jobs are leased ahead of the free handlers and
    ACKs go out in batches (ACKB); `prefetch=0, ack_batch=False` pulls for free handlers only
    and ACKs each job as its handler returns.

        with Worker("emails", send, concurrency=10, url="tcp://127.0.0.1:6789") as worker:
            worker.start()   # in a background thread; or worker.run() to block
            ...
        # leaving the block closes it: stop pulling, give back the prefetched jobs, let the
        # running handlers finish, flush ACKs

    A handler's return value is the job's result; an exception fails the job (retried by the
    server while attempts remain), `UnrecoverableError` sends it to the DLQ at once.
    """

    def __init__(
        self,
        queue: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        url: str = DEFAULT_URL,
        **options: Unpack[WorkerOptions],
    ) -> None:
        self._impl = AsyncWorker(queue, handler, concurrency=concurrency, url=url, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._closing: asyncio.Task[WorkerStats] | None = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Worker({self.queue!r}, {self.config.url!r})"

    @property
    def queue(self) -> str:
        return self._impl.queue

    @property
    def config(self) -> WorkerConfig:
        return self._impl.config

    @property
    def stats(self) -> WorkerStats:
        """Jobs processed, failed, released, lost and expired so far."""
        return self._impl.stats

    def run(self) -> WorkerStats:
        """Serve in this thread until `close()` (from another thread or a handler).

        Raises what `AsyncWorker.run` raises.
        """
        return self._block(self._impl.run)

    def run_until_idle(self, timeout: float | None = None) -> WorkerStats:
        """Process jobs in this thread until the queue has no waiting, delayed or active work;
        then close and return the stats.

        Raises:
            WaitTimeout: work remained after `timeout` seconds.
            ServerError: a permanent refusal of PULLB.
        """
        return self._block(lambda: self._impl.run_until_idle(timeout))

    def start(self) -> Worker:
        """Serve in a background thread; returns once its loop runs. `close()` stops it and
        raises what stopped the worker, if anything did.

        Raises:
            RuntimeError: the worker was already started.
        """
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("a worker runs once; create a new one")
            self._thread = threading.Thread(
                target=self._background, name=f"shardq-worker-{self.queue}", daemon=True
            )
        self._thread.start()
        self._running.wait()
        return self

    def close(self, grace: float | None = None) -> WorkerStats:
        """Stop pulling, give the prefetched jobs not started back to the queue at once, let
        running handlers finish for `grace` seconds (default the config's `close_grace`),
        release what is still held, flush ACKs, unregister and close.

        Idempotent. From a sync handler it returns after the grace (it waits for itself);
        from an async handler it starts the close and returns at once.

        Raises:
            Exception: what stopped a worker started with `start()`, if it failed.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            if not self._running.is_set():
                asyncio.run(self._impl.close(grace))
        elif loop is _running_loop():
            # From an async handler on the worker's own loop: it cannot wait for itself.
            self._closing = loop.create_task(self._impl.close(grace))
            return self.stats
        else:
            asyncio.run_coroutine_threadsafe(self._impl.close(grace), loop).result()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self.stats

    def _background(self) -> None:
        try:
            self._block(self._impl.run)
        except BaseException as e:  # reported by close()
            self._error = e
        finally:
            self._running.set()

    def _block(self, work: Callable[[], Awaitable[WorkerStats]]) -> WorkerStats:
        async def main() -> WorkerStats:
            self._loop = asyncio.get_running_loop()
            self._running.set()
            return await work()

        return asyncio.run(main())


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
