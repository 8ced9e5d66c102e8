"""A worker's bookkeeping, sans-IO: slots, leases, the ACK buffer, and the commands they imply.

The asyncio driver (`AsyncWorker`) owns the I/O and the clock; this object decides what to ask
for and what to send:

- a pull asks for exactly the free slots (no prefetch), with an owner and a lease TTL;
- every job pulled is *held* until its ACK or FAIL is answered, or it is released: held jobs
  are what heartbeats renew and what a hard close gives back;
- a slot frees when the handler returns, before its ACK is answered, so a slow ACK (or a
  buffered one) never idles a handler.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from shardq.client._errors import UnrecoverableError
from shardq.client._models import Job

__all__ = ["Lease", "WorkerState", "WorkerStats"]

MAX_PULL: Final = 1000  # PULLB's count limit (reference §3.3)
DEFAULT_STACK_LINES: Final = 10  # bunqueue's stackTraceLimit default (§3.6)


@dataclass(eq=False)
class Lease:
    """A job this worker holds, with the token that fences its completion."""

    job: Job
    token: str | None
    running: bool = True

    def fenced(self, command: dict[str, Any]) -> dict[str, Any]:
        """`command` with this lease's token added (when the server gave one)."""
        if self.token:
            command["token"] = self.token
        return command


@dataclass(frozen=True)
class WorkerStats:
    """What a worker did: jobs ACKed, FAILed, released at close, and completions the server
    refused because the lease was gone (the job runs again elsewhere)."""

    processed: int = 0
    failed: int = 0
    released: int = 0
    lost: int = 0


@dataclass
class _Counters:
    processed: int = 0
    failed: int = 0
    released: int = 0
    lost: int = 0


@dataclass
class WorkerState:
    """Slots, held leases and buffered ACKs of one worker on one queue."""

    queue: str
    owner: str
    concurrency: int
    lock_ttl_ms: int
    ack_batch_size: int = 100
    held: dict[str, Lease] = field(default_factory=dict)
    running: int = 0
    acks: list[tuple[Lease, Any]] = field(default_factory=list)
    counters: _Counters = field(default_factory=_Counters)

    @property
    def free(self) -> int:
        """Handler slots not in use."""
        return self.concurrency - self.running

    def stats(self) -> WorkerStats:
        c = self.counters
        return WorkerStats(c.processed, c.failed, c.released, c.lost)

    # -- pulling ---------------------------------------------------------------------------

    def pull_command(self, timeout_ms: int) -> dict[str, Any] | None:
        """PULLB for the free slots with a long-poll of `timeout_ms`; None with no free slot."""
        count = min(self.free, MAX_PULL)
        if count <= 0:
            return None
        return {
            "cmd": "PULLB",
            "queue": self.queue,
            "count": count,
            "owner": self.owner,
            "lockTtl": self.lock_ttl_ms,
            "timeout": timeout_ms,
        }

    def admit(self, reply: Mapping[str, Any]) -> list[Lease]:
        """Hold the jobs of a PULLB reply (each takes a slot); tokens line up with jobs."""
        jobs = reply.get("jobs") or []
        tokens = reply.get("tokens") or []
        leases = []
        for i, raw in enumerate(jobs):
            token = tokens[i] if i < len(tokens) and isinstance(tokens[i], str) else None
            lease = Lease(Job.from_wire(raw), token or None)
            self.held[lease.job.id] = lease
            leases.append(lease)
        self.running += len(leases)
        return leases

    def handler_done(self, lease: Lease) -> None:
        """The handler returned or raised: its slot is free, the job is still held."""
        if lease.running:
            lease.running = False
            self.running -= 1

    def drop(self, lease: Lease) -> None:
        """The job is no longer held (answered, refused, or released)."""
        self.handler_done(lease)
        if self.held.get(lease.job.id) is lease:
            del self.held[lease.job.id]

    # -- heartbeats and release ------------------------------------------------------------

    def heartbeat_command(self) -> dict[str, Any] | None:
        """JobHeartbeatB renewing every held lease; None when nothing is held."""
        leased = [lease for lease in self.held.values() if lease.token]
        if not leased:
            return None
        return {
            "cmd": "JobHeartbeatB",
            "ids": [lease.job.id for lease in leased],
            "tokens": [lease.token for lease in leased],
        }

    def release_command(self, lease: Lease) -> dict[str, Any]:
        """MoveToWait: give the job back to the queue without charging an attempt."""
        return lease.fenced({"cmd": "MoveToWait", "id": lease.job.id})

    def unbuffered(self) -> list[Lease]:
        """Held leases whose ACK is not waiting in the buffer (what a hard close releases)."""
        buffered = {id(lease) for lease, _ in self.acks}
        return [lease for lease in self.held.values() if id(lease) not in buffered]

    # -- completions -----------------------------------------------------------------------

    def ack_command(self, lease: Lease, result: Any) -> dict[str, Any]:
        command: dict[str, Any] = {"cmd": "ACK", "id": lease.job.id}
        if result is not None:
            command["result"] = result
        return lease.fenced(command)

    def buffer_ack(self, lease: Lease, result: Any) -> bool:
        """Keep an ACK for the next ACKB; True when the buffer is full and should be sent."""
        self.acks.append((lease, result))
        return len(self.acks) >= self.ack_batch_size

    def take_acks(self) -> tuple[list[Lease], dict[str, Any]] | None:
        """The buffered ACKs as one ACKB (the buffer empties); None when it is empty."""
        if not self.acks:
            return None
        batch, self.acks = self.acks, []
        leases = [lease for lease, _ in batch]
        command = {
            "cmd": "ACKB",
            "ids": [lease.job.id for lease in leases],
            "tokens": [lease.token or "" for lease in leases],
            "results": [result for _, result in batch],
        }
        return leases, command

    def fail_command(self, lease: Lease, error: BaseException) -> dict[str, Any]:
        """FAIL with the error's message and the last lines of its traceback (the server
        keeps the first `stackTraceLimit` lines it gets); `UnrecoverableError` skips retries."""
        limit = lease.job.raw.get("stackTraceLimit")
        keep = int(limit) if isinstance(limit, int | float) else DEFAULT_STACK_LINES
        lines = "".join(traceback.format_exception(error)).rstrip().splitlines()
        command: dict[str, Any] = {
            "cmd": "FAIL",
            "id": lease.job.id,
            "error": str(error) or type(error).__name__,
            "stack": lines[-keep:] if keep > 0 else [],
        }
        if isinstance(error, UnrecoverableError):
            command["unrecoverable"] = True
        return lease.fenced(command)
