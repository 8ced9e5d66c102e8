"""`AsyncQueue`: the asyncio twin of `Queue`, running the same `Op`s."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from shardq.client import _ops as ops
from shardq.client._async_connection import AsyncConnection
from shardq.client._async_events import AsyncEventCallbacks, AsyncEventStream
from shardq.client._connection import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT
from shardq.client._errors import JobFailed, WaitTimeout
from shardq.client._events import QueueEvent
from shardq.client._models import DlqEntry, Job, JobCounts
from shardq.client._ops import BulkJob, Op, Options
from shardq.client._queue import (
    BULK_WINDOW,
    DLQ_SHOWN,
    WAIT_SLICE_MS,
    dead_lettered,
    validate_queue_name,
)
from shardq.client._retry import RetryPolicy
from shardq.client._url import DEFAULT_URL

__all__ = ["AsyncQueue", "async_join"]

T = TypeVar("T")


class AsyncQueue:
    """One queue on a shardq server, for asyncio code. Methods mirror `Queue` and raise the
    same errors; concurrent calls from many tasks share the connection (pipelined)."""

    def __init__(
        self,
        name: str,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        retry: RetryPolicy | None = RetryPolicy(),  # noqa: B008 (frozen, so shared safely)
        connection: AsyncConnection | None = None,
        tls_context: ssl.SSLContext | None = None,
        zmq_server_key: str | None = None,
        tls_ca_file: str | None = None,
    ) -> None:
        self.name = validate_queue_name(name)
        self._owns = connection is None
        self.connection = connection or AsyncConnection(
            url,
            token=token,
            timeout=timeout,
            connect_timeout=connect_timeout,
            retry=retry,
            tls_context=tls_context,
            zmq_server_key=zmq_server_key,
            tls_ca_file=tls_ca_file,
        )
        self._callbacks: AsyncEventCallbacks | None = None

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncQueue({self.name!r}, {str(self.connection.endpoint)!r})"

    async def close(self) -> None:
        """Close the connection (unless it was passed in) and the event listeners. Idempotent."""
        if self._callbacks is not None:
            await self._callbacks.close()
        if self._owns:
            await self.connection.close()

    def events(self, *, since: int | None = None) -> AsyncEventStream:
        """This queue's job events: `async for event in queue.events()`. See `Queue.events`."""
        return self.connection.events(self.name, since=since)

    async def on(self, name: str, listener: Callable[[QueueEvent], object]) -> AsyncQueue:
        """Call `listener(event)` (awaited if it returns an awaitable) for each event named
        `name`, from a task of its own. See `Queue.on`."""
        if self._callbacks is None:
            self._callbacks = AsyncEventCallbacks(self.events)
        await self._callbacks.on(name, listener)
        return self

    def off(self, name: str, listener: Callable[[QueueEvent], object]) -> AsyncQueue:
        """Stop calling `listener` for `name`."""
        if self._callbacks is not None:
            self._callbacks.off(name, listener)
        return self

    async def _run(self, op: Op[T]) -> T:
        replies = await self.connection.call_many(
            op.commands, wait=op.wait_s, idempotent=op.idempotent, check=op.check
        )
        return op.parse(replies)

    async def add(self, name: str, data: Any = None, options: Options = None) -> str:
        """Add one job; return its id. See `Queue.add`."""
        # `ops.add` without its `Op`: the hot path of pipelined producers.
        command, idempotent = ops.push(self.name, name, data, options)
        reply = await self.connection.call(command, idempotent=idempotent)
        return str(reply["id"])

    async def add_bulk(self, jobs: Iterable[BulkJob], *, chunk_size: int = 1000) -> list[str]:
        """Add jobs in pipelined PUSHB chunks; ids in order. See `Queue.add_bulk`."""
        if not 1 <= chunk_size <= 1000:
            raise ValueError(f"chunk_size must be in 1..1000, got {chunk_size}")
        ids: list[str] = []
        window: list[Op[list[str]]] = []
        for chunk in ops.chunked(jobs, chunk_size):
            window.append(ops.add_bulk(self.name, chunk))
            if len(window) >= BULK_WINDOW:
                ids.extend(await self._run_bulk(window))
                window = []
        if window:
            ids.extend(await self._run_bulk(window))
        return ids

    async def _run_bulk(self, window: list[Op[list[str]]]) -> list[str]:
        commands = [op.commands[0] for op in window]
        idempotent = all(op.idempotent for op in window)
        replies = await self.connection.call_many(commands, idempotent=idempotent)
        return [i for op, reply in zip(window, replies, strict=True) for i in op.parse([reply])]

    async def get_job(self, job_id: str) -> Job | None:
        """The job with this id, or None. See `Queue.get_job`."""
        return await self._run(ops.get_job(job_id))

    async def get_state(self, job_id: str) -> str:
        """The job's state, or "unknown". See `Queue.get_state`."""
        return await self._run(ops.get_state(job_id))

    async def counts(self) -> JobCounts:
        """The queue's jobs by state."""
        return await self._run(ops.counts(self.name))

    async def pause(self) -> None:
        """Stop handing out jobs."""
        await self._run(ops.pause(self.name))

    async def resume(self) -> None:
        """Hand out jobs again."""
        await self._run(ops.resume(self.name))

    async def is_paused(self) -> bool:
        """True while the queue is paused."""
        return await self._run(ops.is_paused(self.name))

    async def drain(self) -> int:
        """Remove waiting and delayed jobs; how many."""
        return await self._run(ops.drain(self.name))

    async def clean(
        self, grace_ms: int = 0, state: str = "completed", limit: int = 1000
    ) -> list[str]:
        """Remove old jobs in `state`; their ids. See `Queue.clean`."""
        return await self._run(ops.clean(self.name, grace_ms, state, limit))

    async def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a queued or running job, as `Queue.cancel` does."""
        return await self._run(ops.cancel(job_id, reason))

    async def obliterate(self) -> None:
        """Delete the queue and everything in it."""
        await self._run(ops.obliterate(self.name))

    async def dlq(self, count: int | None = None) -> list[DlqEntry]:
        """The dead-lettered jobs, oldest first."""
        return await self._run(ops.dlq(self.name, count))

    async def retry_dlq(self, job_id: str | None = None, count: int | None = None) -> int:
        """Move DLQ jobs back to waiting; how many. See `Queue.retry_dlq`."""
        return await self._run(ops.retry_dlq(self.name, job_id, count))

    async def purge_dlq(self) -> int:
        """Delete every dead-lettered job; how many."""
        return await self._run(ops.purge_dlq(self.name))

    async def wait_for(self, job_id: str, timeout: float = 30.0) -> Any:
        """The job's result once it completes. Raises `JobFailed`, `NotFound`, `WaitTimeout`
        (see `Queue.wait_for`)."""
        deadline = time.monotonic() + timeout
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            if await self.get_state(job_id) == "failed":
                job = await self.get_job(job_id)
                raise JobFailed(job_id, job.failed_reason if job else None)
            done, result = await self._run(ops.wait_job(job_id, min(left_ms, WAIT_SLICE_MS)))
            if done:
                return result
        raise WaitTimeout(f"job {job_id} did not complete within {timeout:g} s")

    async def wait_until_finished(
        self, timeout: float = 30.0, *, poll_interval: float = 0.05
    ) -> JobCounts:
        """Poll until no unfinished work remains. Raises `WaitTimeout`."""
        return await self._poll(lambda c: c.unfinished == 0, timeout, poll_interval, False)

    async def join(self, timeout: float = 30.0, *, poll_interval: float = 0.05) -> JobCounts:
        """`wait_until_finished` that fails fast. Raises `DeadLettered`, `WaitTimeout`."""
        return await self._poll(lambda c: c.unfinished == 0, timeout, poll_interval, True)

    async def _poll(
        self, done: Callable[[JobCounts], bool], timeout: float, interval: float, fail_fast: bool
    ) -> JobCounts:
        deadline = time.monotonic() + timeout
        while True:
            counts = await self.counts()
            if fail_fast and counts.failed:
                raise dead_lettered(self.name, await self.dlq(DLQ_SHOWN))
            if done(counts):
                return counts
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"queue {self.name!r} has work after {timeout:g} s: {counts}")
            await asyncio.sleep(interval)


async def async_join(queue: AsyncQueue, timeout: float = 30.0) -> JobCounts:
    """The asyncio `join`: raises `DeadLettered` or `WaitTimeout` (see `Queue.join`)."""
    return await queue.join(timeout)
