"""`Queue`: produce jobs and manage one queue, over a blocking `Connection`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from shardq.client import _ops as ops
from shardq.client._connection import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, Connection
from shardq.client._errors import DeadLettered, JobFailed, WaitTimeout
from shardq.client._events import EventCallbacks, EventStream, QueueEvent
from shardq.client._models import DlqEntry, Job, JobCounts
from shardq.client._ops import BulkJob, Op, Options
from shardq.client._retry import RetryPolicy
from shardq.client._url import DEFAULT_URL

if TYPE_CHECKING:  # loaded for `tls://` alone (`_url.ClientSecurity.tls_for`)
    import ssl

__all__ = ["Queue", "dead_lettered", "join", "validate_queue_name"]

T = TypeVar("T")

WAIT_SLICE_MS: Final = 1000  # a WaitJob slice: how soon wait_for notices a dead-lettered job
BULK_WINDOW: Final = 4  # PUSHB chunks in flight at once (more only queues up at the server)
DLQ_SHOWN: Final = 20  # DLQ entries a DeadLettered error names


def dead_lettered(queue: str, entries: list[DlqEntry]) -> DeadLettered:
    """The error `join` raises for these DLQ entries."""
    return DeadLettered(queue, [(e.job.id, e.error or e.reason) for e in entries])


def validate_queue_name(name: str) -> str:
    """`name`, or ValueError: a queue name is a non-empty str (both queue classes)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a queue name must be a non-empty str, got {name!r}")
    return name


class Queue:
    """One queue on a shardq server: add jobs, read them, control the queue and its DLQ.

    `url` is `tcp://host:port` or `zmq://host:port`. The connection opens at the first call,
    sends `Auth` first when `token` is set, and reconnects after a loss; transient errors are
    retried by `retry` only where a resend cannot apply a command twice. Pass `connection`
    to share one connection between queues (the queue then does not close it).
    `zmq_server_key`, `tls_ca_file` and `tls_context` secure it as for `Connection` (unset:
    from `SHARDQ_ZMQ_SERVER_KEY` and `SHARDQ_TLS_CA_FILE`), its event streams too.
    Safe to use from several threads; requests from them share the connection (pipelined).
    """

    def __init__(
        self,
        name: str,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        retry: RetryPolicy | None = RetryPolicy(),  # noqa: B008 (frozen, so shared safely)
        connection: Connection | None = None,
        tls_context: ssl.SSLContext | None = None,
        zmq_server_key: str | None = None,
        tls_ca_file: str | None = None,
    ) -> None:
        self.name = validate_queue_name(name)
        self._owns = connection is None
        self.connection = connection or Connection(
            url,
            token=token,
            timeout=timeout,
            connect_timeout=connect_timeout,
            retry=retry,
            tls_context=tls_context,
            zmq_server_key=zmq_server_key,
            tls_ca_file=tls_ca_file,
        )
        self._callbacks: EventCallbacks | None = None

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, {str(self.connection.endpoint)!r})"

    def close(self) -> None:
        """Close the connection (unless it was passed in) and the event listeners. Idempotent."""
        if self._callbacks is not None:
            self._callbacks.close()
        if self._owns:
            self.connection.close()

    def events(self, *, since: int | None = None) -> EventStream:
        """This queue's job events, as a blocking iterator on a connection of its own
        (docs/protocol.md §18); `since` replays the events after that id the server still
        holds. Iterating raises `ConnectionLost` once reconnecting fails, and the server's
        error if it refuses the subscription."""
        return self.connection.events(self.name, since=since)

    def on(self, name: str, listener: Callable[[QueueEvent], object]) -> Queue:
        """Call `listener(event)` for each event named `name` (bunqueue's `completed`,
        `pushed`, `pulled` ..., BullMQ's `waiting` and `active`, or "*"), from a thread of its
        own, from now on. Raises `ConnectionLost` or the server's refusal at the first `on`."""
        if self._callbacks is None:
            self._callbacks = EventCallbacks(self.events)
        self._callbacks.on(name, listener)
        return self

    def off(self, name: str, listener: Callable[[QueueEvent], object]) -> Queue:
        """Stop calling `listener` for `name`."""
        if self._callbacks is not None:
            self._callbacks.off(name, listener)
        return self

    def _run(self, op: Op[T]) -> T:
        replies = self.connection.call_many(
            op.commands, wait=op.wait_s, idempotent=op.idempotent, check=op.check
        )
        return op.parse(replies)

    # -- producing --------------------------------------------------------------------------

    def add(self, name: str, data: Any = None, options: Options = None) -> str:
        """Add one job named `name` with payload `data`; return its id.

        `options` is a `JobOptions` or a map of bunqueue wire fields. Every method raises
        `ServerError` (a refusal), `CommandTimeout`, `ConnectionLost` (after retries),
        `SerializationError` (data msgpack cannot encode) or `ClientClosed`; only the
        exceptions particular to a method are listed below.
        """
        return self._run(ops.add(self.name, name, data, options))

    def add_bulk(self, jobs: Iterable[BulkJob], *, chunk_size: int = 1000) -> list[str]:
        """Add `(name, data)` or `(name, data, options)` jobs in PUSHBs of `chunk_size`
        (at most 1000), a few pipelined at once; return the ids in order.

        A refusal raises after earlier chunks were accepted (PUSHB keeps its prefix).
        Raises `ValueError` for a chunk size outside 1..1000.
        """
        if not 1 <= chunk_size <= 1000:
            raise ValueError(f"chunk_size must be in 1..1000, got {chunk_size}")
        ids: list[str] = []
        window: list[Op[list[str]]] = []
        for chunk in ops.chunked(jobs, chunk_size):
            window.append(ops.add_bulk(self.name, chunk))
            if len(window) >= BULK_WINDOW:
                ids.extend(self._run_bulk(window))
                window = []
        if window:
            ids.extend(self._run_bulk(window))
        return ids

    def _run_bulk(self, window: list[Op[list[str]]]) -> list[str]:
        commands = [op.commands[0] for op in window]
        idempotent = all(op.idempotent for op in window)
        replies = self.connection.call_many(commands, idempotent=idempotent)
        return [i for op, reply in zip(window, replies, strict=True) for i in op.parse([reply])]

    # -- reading ----------------------------------------------------------------------------

    def get_job(self, job_id: str) -> Job | None:
        """The job with this id (with `state`, `result`, `failed_reason`), or None."""
        return self._run(ops.get_job(job_id))

    def get_state(self, job_id: str) -> str:
        """The job's state: waiting, prioritized, delayed, active, completed, failed,
        waiting-children, or "unknown" for an id the server does not know."""
        return self._run(ops.get_state(job_id))

    def counts(self) -> JobCounts:
        """The queue's jobs by state."""
        return self._run(ops.counts(self.name))

    # -- control ----------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop handing out jobs (pushes are still accepted)."""
        self._run(ops.pause(self.name))

    def resume(self) -> None:
        """Hand out jobs again after `pause`."""
        self._run(ops.resume(self.name))

    def is_paused(self) -> bool:
        """True while the queue is paused."""
        return self._run(ops.is_paused(self.name))

    def drain(self) -> int:
        """Remove every waiting and delayed job; return how many."""
        return self._run(ops.drain(self.name))

    def clean(self, grace_ms: int = 0, state: str = "completed", limit: int = 1000) -> list[str]:
        """Remove up to `limit` jobs in `state` that finished (or were added, for waiting
        states) at least `grace_ms` ago; return their ids. Raises `ValueError` for a state
        Clean does not take."""
        return self._run(ops.clean(self.name, grace_ms, state, limit))

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a job: a queued one is removed; a running one is dead-lettered at once
        (failedReason `cancelled: <reason>`, never retried) and the worker running it is
        told by the server: its handler sees `current_job().cancelled`, an async handler is
        cancelled. False when the job is unknown or already finished."""
        return self._run(ops.cancel(job_id, reason))

    def obliterate(self) -> None:
        """Delete the queue and everything in it (jobs, DLQ, settings)."""
        self._run(ops.obliterate(self.name))

    # -- the DLQ ----------------------------------------------------------------------------

    def dlq(self, count: int | None = None) -> list[DlqEntry]:
        """The dead-lettered jobs, oldest first (at most `count`)."""
        return self._run(ops.dlq(self.name, count))

    def retry_dlq(self, job_id: str | None = None, count: int | None = None) -> int:
        """Move one job (`job_id`) or the oldest `count` (default all) from the DLQ back to
        waiting; return how many moved."""
        return self._run(ops.retry_dlq(self.name, job_id, count))

    def purge_dlq(self) -> int:
        """Delete every dead-lettered job; return how many."""
        return self._run(ops.purge_dlq(self.name))

    # -- waiting ----------------------------------------------------------------------------

    def wait_for(self, job_id: str, timeout: float = 30.0) -> Any:
        """Wait until the job completes and return its result.

        Raises:
            JobFailed: the job was dead-lettered.
            NotFound: the server does not know the job.
            WaitTimeout: it did not complete within `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            if self.get_state(job_id) == "failed":
                job = self.get_job(job_id)
                raise JobFailed(job_id, job.failed_reason if job else None)
            done, result = self._run(ops.wait_job(job_id, min(left_ms, WAIT_SLICE_MS)))
            if done:
                return result
        raise WaitTimeout(f"job {job_id} did not complete within {timeout:g} s")

    def wait_until_finished(
        self, timeout: float = 30.0, *, poll_interval: float = 0.05
    ) -> JobCounts:
        """Poll the counts until no job is waiting, delayed, active, paused or waiting for
        children; return the last counts. Raises `WaitTimeout` past `timeout` seconds."""
        return self._poll(lambda c: c.unfinished == 0, timeout, poll_interval, fail_fast=False)

    def join(self, timeout: float = 30.0, *, poll_interval: float = 0.05) -> JobCounts:
        """`wait_until_finished`, but fail as soon as the queue's DLQ holds a job.

        Raises:
            DeadLettered: the DLQ is not empty (naming its jobs and reasons).
            WaitTimeout: work remained after `timeout` seconds.
        """
        return self._poll(lambda c: c.unfinished == 0, timeout, poll_interval, fail_fast=True)

    def _poll(
        self, done: Callable[[JobCounts], bool], timeout: float, interval: float, *, fail_fast: bool
    ) -> JobCounts:
        deadline = time.monotonic() + timeout
        while True:
            counts = self.counts()
            if fail_fast and counts.failed:
                raise dead_lettered(self.name, self.dlq(DLQ_SHOWN))
            if done(counts):
                return counts
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"queue {self.name!r} has work after {timeout:g} s: {counts}")
            time.sleep(interval)


def join(queue: Queue, timeout: float = 30.0) -> JobCounts:
    """Wait until `queue` has no unfinished work; raise `DeadLettered` if a job is in its DLQ
    and `WaitTimeout` past `timeout` seconds (dramatiq's `join`). See `Queue.join`."""
    return queue.join(timeout)
