"""`AsyncWorker`: pull jobs, run the handler, renew leases, ACK or FAIL, close cleanly.

The asyncio driver of `WorkerState`. One connection carries everything, pipelined: a
long-poll PULLB for the free slots, ACKs and FAILs as handlers finish, and a JobHeartbeatB
per heartbeat interval. Async handlers run on the loop, sync ones in a thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Unpack

import msgpack  # type: ignore[import-untyped]
import structlog

from shardq.client._connection import AsyncConnection
from shardq.client._errors import (
    ClientError,
    SerializationError,
    ServerError,
    WaitTimeout,
    is_transient,
)
from shardq.client._models import Job, JobCounts
from shardq.client._url import DEFAULT_URL
from shardq.client._worker_config import WorkerConfig, WorkerOptions
from shardq.client._worker_state import Lease, WorkerState, WorkerStats

__all__ = ["AsyncWorker", "Handler"]

Handler = Callable[[Job], Any]
"""`handler(job) -> result`, sync or async; raise to fail the job."""

IDLE_POLL_MS: Final = 200  # run_until_idle's long-poll: how soon it notices the queue is empty
RELEASE_TIMEOUT_S: Final = 2.0  # a release at close is best effort; do not hang on it

_log = structlog.get_logger("shardq.client")


def _is_async(handler: Handler) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 (an object with async __call__)
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def _encodable(result: Any) -> str | None:
    """None if `result` can travel in an ACK, else why not."""
    try:
        msgpack.packb(result, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        return f"the handler's result cannot be sent: {e}"
    return None


class AsyncWorker:
    """Runs `handler` for the jobs of `queue`, `concurrency` at a time (see `WorkerConfig`).

    `await worker.run()` serves until `await worker.close()`; `run_until_idle()` stops once
    the queue has no waiting, delayed or active work. A worker runs once.
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
        if not isinstance(queue, str) or not queue:
            raise ValueError(f"a queue name must be a non-empty str, got {queue!r}")
        self.queue = queue
        self.handler = handler
        self.config = cfg = WorkerConfig(concurrency=concurrency, url=url, **options)
        self._state = WorkerState(
            queue, cfg.owner, cfg.concurrency, cfg.lock_ttl_ms, cfg.ack_batch_size
        )
        self._conn = AsyncConnection(
            cfg.url, token=cfg.token, timeout=cfg.timeout, connect_timeout=cfg.connect_timeout
        )
        self._async_handler = _is_async(handler)
        self._executor: ThreadPoolExecutor | None = None
        self._log = _log.bind(queue=queue, owner=cfg.owner)
        self._grace = cfg.close_grace
        self._stopping = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._done = asyncio.Event()
        self._started = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._aux: set[asyncio.Task[None]] = set()
        self._flush_lock = asyncio.Lock()
        self._flush_timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"AsyncWorker({self.queue!r}, {str(self._conn.endpoint)!r})"

    async def __aenter__(self) -> AsyncWorker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def stats(self) -> WorkerStats:
        """Jobs processed, failed, released and lost so far."""
        return self._state.stats()

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> WorkerStats:
        """Serve until `close()`; return the stats.

        Raises:
            ServerError: a permanent refusal of PULLB (e.g. `AuthenticationFailed`, a bad
                queue name); the worker shuts down first.
            RuntimeError: the worker already ran.
        """
        return await self._serve(idle_exit=False)

    async def run_until_idle(self, timeout: float | None = None) -> WorkerStats:
        """Process jobs until the queue has no waiting, delayed or active work (a paused
        queue's jobs are not waited for), then close; return the stats.

        Raises:
            WaitTimeout: work remained after `timeout` seconds (the worker is closed).
            ServerError: as for `run`.
        """
        try:
            async with asyncio.timeout(timeout):
                return await self._serve(idle_exit=True)
        except TimeoutError:
            await self.close()
            raise WaitTimeout(f"queue {self.queue!r} not idle after {timeout:g} s") from None

    async def close(self, grace: float | None = None) -> WorkerStats:
        """Stop pulling, let running handlers finish for `grace` seconds (default
        `close_grace`), release the jobs still held, flush ACKs, close the connection.
        Idempotent; returns the stats."""
        if grace is not None:
            self._grace = grace
        self._stopping.set()
        self._wakeup.set()
        if self._started:
            await self._done.wait()
        else:
            await self._conn.close()
        return self.stats

    async def _serve(self, *, idle_exit: bool) -> WorkerStats:
        if self._started:
            raise RuntimeError("a worker runs once; create a new one")
        self._started = True
        if not self._async_handler:
            self._executor = ThreadPoolExecutor(
                self.config.concurrency, thread_name_prefix=f"shardq-{self.queue}"
            )
        self._spawn_aux(self._heartbeats())
        try:
            await self._pull_loop(idle_exit)
        finally:
            await asyncio.shield(self._shutdown())
        return self.stats

    # -- pulling ---------------------------------------------------------------------------

    async def _pull_loop(self, idle_exit: bool) -> None:
        failures = 0
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            while not self._stopping.is_set():
                if self._state.free <= 0:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                try:
                    if await self._step(stop, idle_exit):
                        return
                except ClientError as e:
                    if not is_transient(e):
                        raise
                    self._log.warning("pull failed; retrying", error=str(e), attempt=failures)
                    await self._pause(self.config.retry.delay(failures))
                    failures += 1
                    continue
                failures = 0
        finally:
            stop.cancel()

    async def _step(self, stop: asyncio.Future[Any], idle_exit: bool) -> bool:
        """Pull once and start the handlers; True when `idle_exit` and the queue is idle."""
        leases = await self._pull(stop, idle_exit)
        if self._stopping.is_set():
            return False  # leases stay held; _shutdown releases them
        for lease in leases:
            task = asyncio.ensure_future(self._process(lease))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return idle_exit and not leases and await self._idle()

    async def _pull(self, stop: asyncio.Future[Any], idle_exit: bool) -> list[Lease]:
        poll_ms = min(self.config.poll_timeout_ms, IDLE_POLL_MS if idle_exit else 60_000)
        command = self._state.pull_command(poll_ms)
        if command is None:
            return []
        pull = asyncio.ensure_future(self._conn.call(command, wait=poll_ms / 1000))
        await asyncio.wait({pull, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not pull.done() and self._conn.releases_on_close:
            # Closing the TCP connection releases whatever this poll still gets.
            pull.cancel()
            return []
        reply = await pull  # ZeroMQ: wait it out, so its jobs can be given back
        return self._state.admit(reply)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _idle(self) -> bool:
        await self._flush_acks()
        if self._state.held:
            return False
        reply = await self._conn.call({"cmd": "GetJobCounts", "queue": self.queue})
        return JobCounts.from_wire(reply.get("counts") or {}).workable == 0

    # -- running a job ---------------------------------------------------------------------

    async def _process(self, lease: Lease) -> None:
        try:
            result = await self._invoke(lease.job)
        except asyncio.CancelledError:
            raise  # past the close grace: _shutdown releases the job
        except Exception as e:
            self._slot_free(lease)
            self._log.info("job failed", job_id=lease.job.id, error=repr(e))
            await self._fail(lease, e)
        else:
            self._slot_free(lease)
            await self._complete(lease, result)

    async def _invoke(self, job: Job) -> Any:
        if self._async_handler:
            return await self.handler(job)
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, functools.partial(self.handler, job))
        if inspect.isawaitable(result):
            result = await result
        return result

    def _slot_free(self, lease: Lease) -> None:
        self._state.handler_done(lease)
        self._wakeup.set()

    async def _complete(self, lease: Lease, result: Any) -> None:
        problem = _encodable(result) if self.config.ack_batch else None
        if problem is not None:
            await self._fail(lease, TypeError(problem))
        elif self.config.ack_batch:
            if self._state.buffer_ack(lease, result):
                await self._flush_acks()
            else:
                self._arm_flush()
        else:
            await self._finish(lease, self._state.ack_command(lease, result), "processed")

    async def _fail(self, lease: Lease, error: BaseException) -> None:
        await self._finish(lease, self._state.fail_command(lease, error), "failed")

    async def _finish(self, lease: Lease, command: dict[str, Any], outcome: str) -> None:
        """Send an ACK or FAIL (retrying transient errors); the job is no longer held after."""
        try:
            reply = await self._send(command)
        except ServerError as e:
            self._lost([lease], e)
            return
        except SerializationError as e:
            if command["cmd"] == "FAIL":
                raise  # cannot happen: a FAIL holds only strings
            await self._fail(lease, e)  # the handler's result cannot travel
            return
        except ClientError as e:
            self._lost([lease], e)
            return
        self._settled([lease], reply, outcome)

    async def _send(self, command: dict[str, Any]) -> dict[str, Any]:
        attempt = 0
        while True:
            try:
                return await self._conn.call(command)
            except ClientError as e:
                if not is_transient(e) or attempt + 1 >= self.config.completion_attempts:
                    raise
            await asyncio.sleep(self.config.retry.delay(attempt))
            attempt += 1

    def _settled(self, leases: list[Lease], reply: dict[str, Any], outcome: str) -> None:
        data = reply.get("data")
        ignored = set(data.get("ignoredIds") or ()) if isinstance(data, dict) else set()
        if isinstance(data, dict) and data.get("applied") is False:
            ignored = {lease.job.id for lease in leases}  # already finalized by the server
        counters = self._state.counters
        for lease in leases:
            self._state.drop(lease)
            if lease.job.id in ignored:
                counters.lost += 1
            elif outcome == "processed":
                counters.processed += 1
            else:
                counters.failed += 1

    def _lost(self, leases: list[Lease], error: ClientError) -> None:
        for lease in leases:
            self._state.drop(lease)
            self._state.counters.lost += 1
            self._log.warning("completion refused", job_id=lease.job.id, error=str(error))

    # -- batched ACKs ----------------------------------------------------------------------

    def _arm_flush(self) -> None:
        if self._flush_timer is None:
            loop = asyncio.get_running_loop()
            self._flush_timer = loop.call_later(self.config.ack_flush_interval, self._on_flush)

    def _on_flush(self) -> None:
        self._flush_timer = None
        self._spawn_aux(self._flush_acks())

    async def _flush_acks(self) -> None:
        async with self._flush_lock:
            while (batch := self._state.take_acks()) is not None:
                leases, command = batch
                try:
                    reply = await self._send(command)
                except ServerError:
                    # ACKB is all-or-nothing per shard: one stale lease refuses the rest.
                    await self._ack_one_by_one(leases, command)
                    continue
                except ClientError as e:
                    self._lost(leases, e)
                    continue
                self._settled(leases, reply, "processed")

    async def _ack_one_by_one(self, leases: list[Lease], batch: dict[str, Any]) -> None:
        results = batch["results"]
        await asyncio.gather(
            *(
                self._finish(lease, self._state.ack_command(lease, result), "processed")
                for lease, result in zip(leases, results, strict=True)
            )
        )

    # -- heartbeats, release, shutdown -----------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            command = self._state.heartbeat_command()
            if command is None:
                continue
            try:
                await self._conn.call(command)
            except ClientError as e:
                self._log.warning("heartbeat failed", error=str(e), jobs=len(command["ids"]))

    async def _release(self, leases: list[Lease]) -> None:
        async def one(lease: Lease) -> None:
            with contextlib.suppress(ClientError):
                await self._conn.call(self._state.release_command(lease), timeout=RELEASE_TIMEOUT_S)
                self._state.counters.released += 1
            self._state.drop(lease)

        await asyncio.gather(*(one(lease) for lease in leases))

    def _spawn_aux(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._aux.add(task)
        task.add_done_callback(self._aux.discard)

    async def _shutdown(self) -> None:
        self._stopping.set()
        stragglers = await self._wait_handlers()
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        await self._flush_acks()
        await self._release(self._state.unbuffered())
        for task in list(self._aux):
            task.cancel()
        await asyncio.gather(*self._aux, return_exceptions=True)
        await self._conn.close()
        if self._executor is not None:
            # A sync handler past the grace cannot be stopped; its thread ends on its own.
            self._executor.shutdown(wait=not stragglers, cancel_futures=True)
        self._done.set()

    async def _wait_handlers(self) -> bool:
        """Wait up to the grace for running handlers; cancel the rest. True if any were."""
        pending = set(self._tasks)
        if pending:
            _, pending = await asyncio.wait(pending, timeout=self._grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if pending:
            self._log.warning("close grace passed; releasing jobs", running=len(pending))
        return bool(pending)
