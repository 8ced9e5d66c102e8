"""`AsyncWorker`: pull jobs, run the handler, renew leases, ACK or FAIL, close cleanly.

The asyncio driver of `WorkerState`. One connection carries everything, pipelined: a PULLB
whenever the prefetch buffer runs low (preceded, in the same write, by the buffered ACKs as
one ACKB), ACKBs as batches fill or their flush interval passes, FAILs as handlers raise, and
JobHeartbeatB per heartbeat interval. Handlers run in a runner (`_runners`): async ones as
`concurrency` tasks on the loop, sync ones in `concurrency` dedicated threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Unpack

from shardq.client._async_connection import AsyncConnection, Submitted
from shardq.client._errors import (
    ClientError,
    SerializationError,
    ServerError,
    WaitTimeout,
    is_transient,
)
from shardq.client._log import client_logger
from shardq.client._models import Job, JobCounts
from shardq.client._runners import AsyncRunner, Outcome, Runner, ThreadRunner
from shardq.client._url import DEFAULT_URL
from shardq.client._worker_config import WorkerConfig, WorkerOptions
from shardq.client._worker_state import Lease, WorkerState, WorkerStats

__all__ = ["AsyncWorker", "Handler"]

Handler = Callable[[Job], Any]
"""`handler(job) -> result`, sync or async; raise to fail the job."""

IDLE_POLL_MS: Final = 200  # run_until_idle's long-poll: how soon it notices the queue is empty
RELEASE_TIMEOUT_S: Final = 2.0  # a release at close is best effort; do not hang on it
PRESENCE_INTERVAL_S: Final = 10.0  # worker Heartbeat (bunqueue's cadence; stale after 30 s)
WORKER_NOT_FOUND: Final = "Worker not found"


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a task nobody awaits any more (it was given up on)."""
    if not task.cancelled():
        task.exception()


def _is_async(handler: Handler) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 (an object with async __call__)
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class AsyncWorker:
    """Runs `handler` for the jobs of `queue`, `concurrency` at a time (see `WorkerConfig`
    for `prefetch`, `ack_batch` and the other options).

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
        if not callable(handler):
            raise TypeError(f"a handler must be callable, got {handler!r}")
        self.queue = queue
        self.handler = handler
        self.config = cfg = WorkerConfig(concurrency=concurrency, url=url, **options)
        self._state = WorkerState(
            queue,
            cfg.owner,
            cfg.concurrency,
            cfg.lock_ttl_ms,
            cfg.ack_batch_size,
            cfg.prefetch,
            cfg.prefetch_max,
        )
        self._conn = AsyncConnection(
            cfg.url,
            token=cfg.token,
            timeout=cfg.timeout,
            connect_timeout=cfg.connect_timeout,
            tls_context=cfg.tls_context,
            zmq_server_key=cfg.zmq_server_key,
            tls_ca_file=cfg.tls_ca_file,
        )
        self._conn.on_push = self._on_push
        self._async_handler = _is_async(handler)
        self._runner: Runner | None = None
        self._log = client_logger().bind(queue=queue, owner=cfg.owner)
        self._grace = cfg.close_grace
        self._stopping = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._done = asyncio.Event()
        self._started = False
        self._accepting = True  # outcomes are acted on (False once the close has released)
        self._registered = -1  # the connection generation RegisterWorker was answered on
        self._completions: set[asyncio.Task[None]] = set()
        self._aux: set[asyncio.Task[None]] = set()
        self._flush_timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"AsyncWorker({self.queue!r}, {str(self._conn.endpoint)!r})"

    async def __aenter__(self) -> AsyncWorker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def stats(self) -> WorkerStats:
        """Jobs processed, failed, released, lost and expired so far."""
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
        """Stop pulling, give the prefetched jobs not started back to the queue at once, let
        running handlers finish for `grace` seconds (default `close_grace`), release the jobs
        still held, flush ACKs, unregister, close the connection. Idempotent; returns the
        stats."""
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
        cfg = self.config
        if self._async_handler:
            self._runner = AsyncRunner(self.handler, cfg.concurrency, self._gate, self._on_done)
        else:
            self._runner = ThreadRunner(
                self.handler, cfg.concurrency, self._gate, self._on_done, f"shardq-{self.queue}"
            )
        self._runner.start()
        self._spawn_aux(self._heartbeats())
        if cfg.register:
            self._spawn_aux(self._presence())
        try:
            await self._pull_loop(self._runner, idle_exit)
        finally:
            await asyncio.shield(self._shutdown(self._runner))
        return self.stats

    # -- pulling ---------------------------------------------------------------------------

    async def _pull_loop(self, runner: Runner, idle_exit: bool) -> None:
        failures = 0
        dry = False  # the last pull came back short: the queue had no more jobs then
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            while not self._stopping.is_set():
                waiting = runner.waiting
                count = self._state.pull_count(waiting)
                if count <= 0 or (dry and waiting):
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                try:
                    leases = await self._step(runner, count, waiting == 0, stop, idle_exit)
                except ClientError as e:
                    if not is_transient(e):
                        raise
                    self._log.warning("pull failed; retrying", error=str(e), attempt=failures)
                    await self._pause(self.config.retry.delay(failures))
                    failures += 1
                    continue
                failures = 0
                if leases is None:
                    return  # idle_exit and the queue is idle
                dry = leases < count
        finally:
            stop.cancel()

    async def _step(
        self,
        runner: Runner,
        count: int,
        long_poll: bool,
        stop: asyncio.Future[Any],
        idle_exit: bool,
    ) -> int | None:
        """Pull once and hand the jobs to the runner; how many came, or None when
        `idle_exit` and the queue is idle.

        Only a worker with no job waiting to start long-polls: a PULLB waiting at the server
        cannot be called back, and would take the jobs a close gives back.
        """
        if self.config.register and self._registered != self._conn.generation:
            await self._register()
        self._flush_acks()  # ahead of the PULLB: the server sees these jobs done first
        leases = await self._pull(count, long_poll, stop, idle_exit)
        if self._stopping.is_set():
            return 0  # leases stay held; _shutdown releases them
        self._state.adapt(count, len(leases), runner.waiting)
        if leases:
            runner.submit(leases)
        elif idle_exit and long_poll and await self._idle():
            return None
        return len(leases)

    async def _pull(
        self, count: int, long_poll: bool, stop: asyncio.Future[Any], idle_exit: bool
    ) -> list[Lease]:
        poll_ms = min(self.config.poll_timeout_ms, IDLE_POLL_MS if idle_exit else 60_000)
        poll_ms = poll_ms if long_poll else 0
        command = self._state.pull_command(count, poll_ms)
        sent_at = time.monotonic()
        # Written now, after the ACKB `_step` just flushed (unless a reconnect is needed).
        sent = self._conn.submit([command], timeout=self._conn.timeout + poll_ms / 1000)
        pull = asyncio.ensure_future(
            sent.replies()
            if sent is not None
            else self._conn.call_many([command], wait=poll_ms / 1000)
        )
        try:
            await asyncio.wait({pull, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # `run_until_idle`'s timeout: the poll must not outlive the worker, or its
            # ConnectionLost (the close that follows) is "never retrieved" on stderr.
            pull.cancel()
            pull.add_done_callback(_consume)
            raise
        if not pull.done() and self._conn.releases_on_close:
            # Closing the TCP connection releases whatever this poll still gets.
            pull.cancel()
            return []
        (reply,) = await pull  # ZeroMQ: wait it out, so its jobs can be given back
        return self._state.admit(reply, sent_at, self._conn.generation)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _idle(self) -> bool:
        await self._settle_completions()
        if self._state.held:
            return False
        reply = await self._conn.call({"cmd": "GetJobCounts", "queue": self.queue})
        return JobCounts.from_wire(reply.get("counts") or {}).workable == 0

    # -- running a job (the runner calls these) --------------------------------------------

    def _gate(self, lease: Lease) -> bool:
        """May this prefetched job start now? (In a handler thread for sync handlers.)"""
        if lease.cancelled:
            return False
        return self._state.runnable(lease, time.monotonic(), self._conn.generation)

    def _on_push(self, msg: dict[str, Any]) -> None:
        """A frame the server sent unasked; a `cancel` names a job this worker may hold
        (`Cancel {active: true}`): its handler sees `current_job().cancelled`, an async
        one is cancelled, and a prefetched one never starts. On the loop."""
        if msg.get("type") != "cancel":
            return
        lease = self._state.held.get(str(msg.get("jobId")))
        if lease is None or lease.cancelled:
            return
        reason = msg.get("reason")
        lease.cancelled = True
        self._log.info("job cancelled", job_id=lease.job.id, reason=reason)
        if lease.running is not None:
            lease.running.cancel(reason if isinstance(reason, str) else None)

    def _on_done(self, lease: Lease, outcome: Outcome, value: Any) -> None:
        """A handler returned, raised, or its job was skipped; on the loop, never raises."""
        if not self._accepting:
            return  # past the close: the job was released
        self._state.finish(lease)
        self._wakeup.set()
        if lease.cancelled:
            # The server already dead-lettered it: no ACK or FAIL (it would be refused).
            self._state.drop(lease)
            self._state.counters.failed += 1
            return
        if outcome is Outcome.OK:
            if value is not None and inspect.isawaitable(value):  # a sync handler's coroutine
                self._track(self._complete_awaitable(lease, value))
            else:
                self._ack(lease, value)
        elif outcome is Outcome.ERROR:
            self._log.warning("job failed", job_id=lease.job.id, error=repr(value))
            self._fail(lease, value)
        else:
            self._expire(lease)

    async def _complete_awaitable(self, lease: Lease, awaitable: Awaitable[Any]) -> None:
        try:
            result = await awaitable
        except Exception as e:
            self._fail(lease, e)
        else:
            self._ack(lease, result)

    def _ack(self, lease: Lease, result: Any) -> None:
        if not self.config.ack_batch:
            self._send_completion([lease], self._state.ack_command(lease, result), "processed")
        elif self._state.buffer_ack(lease, result):
            self._flush_acks()
        elif self._flush_timer is None:
            loop = asyncio.get_running_loop()
            self._flush_timer = loop.call_later(self.config.ack_flush_interval, self._flush_acks)

    def _fail(self, lease: Lease, error: BaseException) -> None:
        self._send_completion([lease], self._state.fail_command(lease, error), "failed")

    def _expire(self, lease: Lease) -> None:
        """A prefetched job whose lease could have lapsed: not run here. Give it back (the
        server refuses if it already handed it out again) so it is not waited for."""
        self._state.counters.expired += 1
        self._log.warning("prefetched job skipped: its lease may have lapsed", job_id=lease.job.id)
        self._track(self._release([lease], count=False))

    # -- completions: ACK, ACKB, FAIL ------------------------------------------------------

    def _flush_acks(self) -> None:
        """Send the buffered ACKs as one ACKB now (written before anything sent after)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        batch = self._state.take_acks()
        if batch is not None:
            leases, command = batch
            self._send_completion(leases, command, "processed")

    def _send_completion(self, leases: list[Lease], command: dict[str, Any], outcome: str) -> None:
        """Write an ACK, ACKB or FAIL now; settle it when its reply comes."""
        try:
            submitted = self._conn.submit([command])
        except SerializationError as e:
            self._track(self._unencodable(leases, command, e))
            return
        self._track(self._settle(leases, command, outcome, submitted))

    async def _settle(
        self, leases: list[Lease], command: dict[str, Any], outcome: str, sent: Submitted | None
    ) -> None:
        try:
            reply = await self._reply(command, sent)
        except ServerError as e:
            if command["cmd"] == "ACKB":
                # ACKB is all-or-nothing per shard: one stale lease refuses the rest.
                await self._ack_one_by_one(leases, command)
            else:
                self._lost(leases, e)
            return
        except SerializationError as e:
            await self._unencodable(leases, command, e)
            return
        except ClientError as e:
            self._lost(leases, e)
            return
        self._settled(leases, reply, outcome)

    async def _reply(self, command: dict[str, Any], sent: Submitted | None) -> dict[str, Any]:
        """The reply to `command`, already sent as `sent` (None: not sent yet); transient
        errors are retried (an ACK, ACKB or FAIL of the same delivery is safe to resend)."""
        attempt = 0
        if sent is not None:
            try:
                return (await sent.replies())[0]
            except ClientError as e:
                if not is_transient(e) or self.config.completion_attempts <= 1:
                    raise
            await asyncio.sleep(self.config.retry.delay(0))
            attempt = 1
        while True:
            try:
                return await self._conn.call(command)
            except ClientError as e:
                if not is_transient(e) or attempt + 1 >= self.config.completion_attempts:
                    raise
            await asyncio.sleep(self.config.retry.delay(attempt))
            attempt += 1

    async def _unencodable(
        self, leases: list[Lease], command: dict[str, Any], error: SerializationError
    ) -> None:
        """A result msgpack cannot encode: find it (ACKB one by one) and fail its job."""
        if command["cmd"] == "ACKB":
            await self._ack_one_by_one(leases, command)
        elif command["cmd"] == "ACK":
            (lease,) = leases
            message = f"the handler's result cannot be sent: {error}"
            await self._settle(leases, self._state.fail_command(lease, TypeError(message)),
                               "failed", None)  # fmt: skip
        else:
            raise error  # cannot happen: a FAIL holds only strings

    async def _ack_one_by_one(self, leases: list[Lease], batch: dict[str, Any]) -> None:
        results = batch.get("results") or [None] * len(leases)
        await asyncio.gather(
            *(
                self._settle([lease], self._state.ack_command(lease, result), "processed", None)
                for lease, result in zip(leases, results, strict=True)
            )
        )

    def _settled(self, leases: list[Lease], reply: dict[str, Any], outcome: str) -> None:
        data = reply.get("data")
        ignored = set(data.get("ignoredIds") or ()) if isinstance(data, dict) else set()
        if isinstance(data, dict) and data.get("applied") is False:
            ignored = {lease.job.id for lease in leases}  # already finalized by the server
        counters = self._state.counters
        drop = self._state.drop
        for lease in leases:
            drop(lease)
            if ignored and lease.job.id in ignored:
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

    def _track(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._completions.add(task)
        task.add_done_callback(self._completions.discard)

    async def _settle_completions(self) -> None:
        """Send the buffered ACKs and wait until every completion sent so far is answered."""
        self._flush_acks()
        while self._completions:
            await asyncio.gather(*self._completions, return_exceptions=True)
            self._flush_acks()

    # -- heartbeats, the worker registry, release, shutdown --------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            await self._renew()

    async def _renew(self) -> None:
        state = self._state
        waiting, commands = state.renewal()
        if not commands:
            return
        sent_at = time.monotonic()
        try:
            replies = await self._conn.call_many(commands)
        except ClientError as e:
            self._log.warning("heartbeat failed", error=str(e), jobs=len(state.held))
            return
        if not waiting:
            return
        data = replies[0].get("data")
        if isinstance(data, dict) and data.get("count") == len(waiting):
            state.renewed(waiting, sent_at)
            return
        # Some waiting lease was not renewed: find out which, one JobHeartbeat each; those
        # refused are not this worker's any more and will fail the gate when their turn comes.
        sent_at = time.monotonic()
        try:
            checks = await self._conn.call_many(
                [state.check_command(lease) for lease in waiting], check=False
            )
        except ClientError as e:
            self._log.warning("heartbeat failed", error=str(e), jobs=len(waiting))
            return
        state.renewed([lease for lease, r in zip(waiting, checks, strict=True)
                       if r.get("ok") is True], sent_at)  # fmt: skip

    async def _register(self) -> None:
        """RegisterWorker on the current connection (an upsert by worker id).

        Raises:
            ClientError: a transient failure (the pull loop backs off and tries again). A
                refusal is logged and not retried on this connection.
        """
        if not self._conn.live:
            await self._conn.connect()
        generation = self._conn.generation
        command = self._state.register_command(
            self.config.worker_name, socket.gethostname(), os.getpid(), int(time.time() * 1000)
        )
        try:
            await self._conn.call(command)
        except ServerError as e:
            if is_transient(e):
                raise
            self._log.warning("RegisterWorker refused", error=str(e))
        # A reconnect during the call leaves the old generation: one harmless re-register.
        self._registered = generation if generation == self._conn.generation else -1

    async def _presence(self) -> None:
        while True:
            await asyncio.sleep(PRESENCE_INTERVAL_S)
            if self._registered != self._conn.generation:
                continue  # the next pull registers first
            try:
                reply = await self._conn.call_many([self._state.presence_command()], check=False)
            except ClientError as e:
                self._log.warning("worker heartbeat failed", error=str(e))
                continue
            if reply[0].get("ok") is not True and WORKER_NOT_FOUND in str(reply[0].get("error")):
                self._registered = -1  # forgotten by the server: register again

    async def _unregister(self) -> None:
        if self._registered < 0 or self._registered != self._conn.generation:
            return  # never registered, or the registration went with its connection
        with contextlib.suppress(ClientError):
            await self._conn.call(self._state.unregister_command(), timeout=RELEASE_TIMEOUT_S)
        self._registered = -1

    async def _release(self, leases: list[Lease], *, count: bool = True) -> None:
        if not leases:
            return
        state = self._state
        try:
            replies = await self._conn.call_many(
                [state.release_command(lease) for lease in leases],
                timeout=RELEASE_TIMEOUT_S,
                check=False,
            )
        except ClientError:
            replies = []
        if count:
            state.counters.released += sum(1 for reply in replies if reply.get("ok") is True)
        for lease in leases:
            state.drop(lease)

    def _spawn_aux(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._aux.add(task)
        task.add_done_callback(self._aux.discard)

    async def _shutdown(self, runner: Runner) -> None:
        self._stopping.set()
        # Jobs that never started go back at once, for other workers to take now.
        early = asyncio.ensure_future(self._release(runner.take_waiting()))
        await runner.stop(self._grace)
        await early
        await self._settle_completions()
        self._accepting = False
        # Left: handlers still running past the grace, jobs a ZeroMQ poll brought after stop.
        await self._release(self._state.unbuffered())
        if self.config.register:
            await self._unregister()
        for task in list(self._aux):
            task.cancel()
        await asyncio.gather(*self._aux, return_exceptions=True)
        await self._conn.close()
        self._done.set()
