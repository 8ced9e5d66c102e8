"""A worker's bookkeeping, sans-IO: leases, the prefetch bound, the ACK buffer, and the
commands they imply.

The asyncio driver (`AsyncWorker`) owns the I/O, the clock and the handlers; this object
decides what to ask for and what to send:

- at most `concurrency + prefetch` jobs are *unfinished* (pulled, handler not returned yet);
  a pull asks for the difference, and only once the buffer of jobs not started yet is down
  to half of `prefetch`, so that pulls come in batches (with `prefetch` 0: the free slots);
  with a `prefetch_max`, the prefetch in force (`window`) doubles while replies find the
  handlers out of jobs, and halves while they find plenty still waiting (`adapt`);
- every job pulled is *held* until its ACK or FAIL is answered, or it is released: held jobs
  are what heartbeats renew and what a close gives back;
- a finished job's ACK may wait in the ACK buffer; the driver sends that buffer ahead of the
  next pull on the same connection, so the server never has more than
  `concurrency + prefetch` of this worker's jobs active;
- a job waiting in the buffer is started only while its lease is surely still its own: the
  request that granted or last renewed it left less than the lease TTL (minus a margin) ago,
  and a lease never renewed must still be on the connection that pulled it (closing a TCP
  connection gives back the jobs whose lease was never renewed, docs/protocol.md §2.6).

Time is an argument: the driver passes its monotonic clock, in seconds.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from shardq.client._current import RunningJob
from shardq.client._errors import UnrecoverableError
from shardq.client._models import Job

__all__ = ["Lease", "WorkerState", "WorkerStats"]

MAX_PULL: Final = 1000  # PULLB's count limit (docs/protocol.md §6.1)
DEFAULT_STACK_LINES: Final = 10  # bunqueue's stackTraceLimit default (docs/protocol.md §6.5)
LEASE_MARGIN_S: Final = 0.5  # a waiting job starts this long before its lease could lapse
# (a tenth of the TTL for leases shorter than 5 s)


@dataclass(eq=False, slots=True)
class Lease:
    """A job this worker holds, with the token that fences its completion.

    `renewed` is when (driver clock) the request that granted or last renewed the lease was
    sent: the server's lease runs at least until `renewed` + TTL.
    """

    job: Job
    token: str | None
    renewed: float = 0.0
    generation: int = 0
    renewals: int = 0
    started: bool = False
    finished: bool = False
    running: RunningJob | None = None  # what `current_job()` gives its handler
    cancelled: bool = False  # the server pushed a cancel for it (`Cancel {active: true}`)

    def fenced(self, command: dict[str, Any]) -> dict[str, Any]:
        """`command` with this lease's token added (when the server gave one)."""
        if self.token:
            command["token"] = self.token
        return command


@dataclass(frozen=True)
class WorkerStats:
    """What a worker did: jobs ACKed, FAILed, released (given back unfinished at close),
    lost (completions the server refused because the lease was gone: the job runs again
    elsewhere) and expired (prefetched jobs not started because their lease could have
    lapsed while they waited: the server hands them out again)."""

    processed: int = 0
    failed: int = 0
    released: int = 0
    lost: int = 0
    expired: int = 0


@dataclass
class _Counters:
    processed: int = 0
    failed: int = 0
    released: int = 0
    lost: int = 0
    expired: int = 0


@dataclass
class WorkerState:
    """Leases, the pull bound and buffered ACKs of one worker on one queue."""

    queue: str
    owner: str
    concurrency: int
    lock_ttl_ms: int
    ack_batch_size: int = 100
    prefetch: int = 0
    prefetch_max: int | None = None
    held: dict[str, Lease] = field(default_factory=dict)
    unfinished: int = 0
    acks: list[tuple[Lease, Any]] = field(default_factory=list)
    counters: _Counters = field(default_factory=_Counters)

    @property
    def capacity(self) -> int:
        """The most unfinished jobs this worker holds at once, for now."""
        return self.concurrency + self.window

    def __post_init__(self) -> None:
        ttl = self.lock_ttl_ms / 1000
        self.lease_window_s = ttl - min(LEASE_MARGIN_S, ttl / 10)
        """How long after a lease was granted or renewed a waiting job may still start."""
        self.window = self.prefetch
        """The prefetch in force: `prefetch`, or up to `prefetch_max` for fast jobs."""
        self._starved = False  # the last pull's reply found the buffer empty (`adapt`)

    def stats(self) -> WorkerStats:
        c = self.counters
        return WorkerStats(c.processed, c.failed, c.released, c.lost, c.expired)

    # -- pulling ---------------------------------------------------------------------------

    def pull_count(self, waiting: int) -> int:
        """How many jobs to pull now, with `waiting` of the unfinished jobs not started yet.

        None while more than half of the prefetch (`window`) would still wait once the idle
        handlers took theirs (nor with no room under the bound). Otherwise the room, but at
        most the idle handlers' share plus half of the prefetch: a pull then leaves room for
        the next one to go out as soon as its jobs arrive, so a refill is always on its way
        while handlers work (two pulls take turns, like double buffering).
        """
        room = self.capacity - self.unfinished
        if room <= 0:
            return 0
        idle = max(0, self.concurrency - (self.unfinished - waiting))
        if waiting - idle > self.window // 2:
            return 0
        return min(room, self.concurrency + (self.window + 1) // 2, MAX_PULL)

    def adapt(self, asked: int, got: int, waiting: int) -> None:
        """A pull for `asked` jobs brought `got`, and found `waiting` still in the buffer.

        Empty, with the queue not drained (a full reply), twice in a row: the handlers run
        out of jobs during each round trip, so the next pulls ask for more (up to
        `prefetch_max`). Once is no sign: a worker's first pull always finds nothing. More
        than a quarter of the window still there: the jobs outlast a round trip, and the
        buffer shrinks back toward `prefetch`, so slow jobs are not hoarded.
        """
        most = self.prefetch_max
        if most is None or most <= self.prefetch:
            return
        starved = waiting == 0 and got >= asked
        if starved and self._starved:
            self.window = min(most, max(1, 2 * self.window))
        elif waiting > self.window // 4:
            self.window = max(self.prefetch, self.window // 2)
        self._starved = starved

    def pull_command(self, count: int, timeout_ms: int) -> dict[str, Any]:
        """PULLB for `count` jobs with a long-poll of `timeout_ms`, an owner and a lease TTL."""
        return {
            "cmd": "PULLB",
            "queue": self.queue,
            "count": count,
            "owner": self.owner,
            "lockTtl": self.lock_ttl_ms,
            "timeout": timeout_ms,
        }

    def admit(self, reply: Mapping[str, Any], sent_at: float, generation: int) -> list[Lease]:
        """Hold the jobs of a PULLB reply (sent at `sent_at` on connection `generation`);
        tokens line up with jobs. Each counts as unfinished."""
        jobs = reply.get("jobs") or []
        tokens = reply.get("tokens") or []
        leases = []
        held = self.held
        for i, raw in enumerate(jobs):
            token = tokens[i] if i < len(tokens) and isinstance(tokens[i], str) else None
            lease = Lease(Job.from_wire(raw), token or None, sent_at, generation)
            held[lease.job.id] = lease
            leases.append(lease)
        self.unfinished += len(leases)
        return leases

    def runnable(self, lease: Lease, now: float, generation: int) -> bool:
        """True if the waiting job of `lease` may start at `now` (see the module docstring)."""
        if now >= lease.renewed + self.lease_window_s:
            return False
        return lease.renewals > 0 or lease.generation == generation

    def finish(self, lease: Lease) -> None:
        """The handler returned or raised, or the job was given up before it started: it no
        longer counts against the bound (it is still held until answered or released)."""
        if not lease.finished:
            lease.finished = True
            self.unfinished -= 1

    def drop(self, lease: Lease) -> None:
        """The job is no longer held (answered, refused, or released)."""
        self.finish(lease)
        if self.held.get(lease.job.id) is lease:
            del self.held[lease.job.id]

    # -- heartbeats and release ------------------------------------------------------------

    def renewal(self) -> tuple[list[Lease], list[dict[str, Any]]]:
        """JobHeartbeatB commands renewing every held lease, and the waiting leases among them.

        The waiting (not started) leases go first, in a command of their own: its reply's
        count then says whether every one of them was renewed. No command when nothing is held.
        """
        waiting: list[Lease] = []
        others: list[Lease] = []
        for lease in self.held.values():
            if lease.token and not lease.cancelled:  # a cancelled job's lease is gone
                (others if lease.started or lease.finished else waiting).append(lease)
        return waiting, [_heartbeat_b(group) for group in (waiting, others) if group]

    def renewed(self, leases: list[Lease], sent_at: float) -> None:
        """These leases were renewed by a request sent at `sent_at`."""
        for lease in leases:
            lease.renewals += 1
            lease.renewed = max(lease.renewed, sent_at)

    def check_command(self, lease: Lease) -> dict[str, Any]:
        """JobHeartbeat for one lease: renews it, or refuses if it is no longer this worker's."""
        return lease.fenced({"cmd": "JobHeartbeat", "id": lease.job.id})

    def release_command(self, lease: Lease) -> dict[str, Any]:
        """MoveToWait: give the job back to the queue without charging an attempt."""
        return lease.fenced({"cmd": "MoveToWait", "id": lease.job.id})

    def unbuffered(self) -> list[Lease]:
        """Held leases whose ACK is not waiting in the buffer (what a close releases)."""
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
        command: dict[str, Any] = {
            "cmd": "ACKB",
            "ids": [lease.job.id for lease in leases],
            "tokens": [lease.token or "" for lease in leases],
        }
        results = [result for _, result in batch]
        if any(result is not None for result in results):
            command["results"] = results
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

    # -- the server's worker registry ------------------------------------------------------

    def register_command(
        self, name: str, hostname: str, pid: int, started_at_ms: int
    ) -> dict[str, Any]:
        """RegisterWorker (an upsert by `workerId`, this worker's owner name), as
        bunqueue-client sends it; `startedAt` in wall-clock milliseconds."""
        return {
            "cmd": "RegisterWorker",
            "name": name,
            "queues": [self.queue],
            "concurrency": self.concurrency,
            "workerId": self.owner,
            "hostname": hostname,
            "pid": pid,
            "startedAt": started_at_ms,
        }

    def presence_command(self) -> dict[str, Any]:
        """The worker `Heartbeat`: alive, with its counters (`ListWorkers` shows them)."""
        c = self.counters
        return {
            "cmd": "Heartbeat",
            "id": self.owner,
            "activeJobs": self.unfinished,
            "processed": c.processed,
            "failed": c.failed,
        }

    def unregister_command(self) -> dict[str, Any]:
        return {"cmd": "UnregisterWorker", "workerId": self.owner}


def _heartbeat_b(leases: list[Lease]) -> dict[str, Any]:
    return {
        "cmd": "JobHeartbeatB",
        "ids": [lease.job.id for lease in leases],
        "tokens": [lease.token for lease in leases],
    }
