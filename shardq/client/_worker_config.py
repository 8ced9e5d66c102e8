"""A worker's settings: one frozen, validated `WorkerConfig` (arq's `RedisSettings` style)."""

from __future__ import annotations

import math
import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypedDict

from shardq.client._connection import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT
from shardq.client._retry import RetryPolicy
from shardq.client._url import DEFAULT_URL, parse_url

if TYPE_CHECKING:  # `tls://` alone needs ssl: its connection imports it when it connects
    import ssl

__all__ = ["DEFAULT_PREFETCH", "WorkerConfig", "WorkerOptions"]

# A worker keeps pulling through a server restart, however long: retry until closed, backing
# off to 2 s so a fleet of workers does not hammer a server that is coming back.
PULL_RETRY: Final = RetryPolicy(attempts=None, base_delay=0.05, max_delay=2.0)

# Enough buffered jobs that a pull (one round trip, every prefetch/2 jobs) is never waited for
# by fast handlers; few enough that one worker does not hoard a queue's backlog. Measured:
# bench/clients.py (BENCHMARKS.md section 3).
DEFAULT_PREFETCH: Final = 64
MAX_PREFETCH: Final = 10_000


def _default_owner() -> str:
    # Unique per worker: the server fences leases by token, the owner names who holds them.
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class WorkerOptions(TypedDict, total=False):
    """Keyword options of `Worker` and `AsyncWorker` (see `WorkerConfig` for each)."""

    token: str | None
    zmq_server_key: str | None
    tls_ca_file: str | None
    tls_context: ssl.SSLContext | None
    prefetch: int
    prefetch_max: int | None
    ack_batch: bool
    ack_batch_size: int
    ack_flush_interval: float
    lock_ttl_ms: int
    heartbeat_interval: float | None
    poll_timeout_ms: int
    close_grace: float
    timeout: float
    connect_timeout: float
    retry: RetryPolicy
    completion_attempts: int
    owner: str
    name: str | None
    register: bool


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker is told; `ValueError` names a setting out of range.

    - `concurrency`: handlers running at once.
    - `url`, `token`, `timeout`, `connect_timeout`: as for `Connection`.
    - `zmq_server_key`, `tls_ca_file`, `tls_context`: how its connection is secured, as for
      `Connection` (None: from `SHARDQ_ZMQ_SERVER_KEY` and `SHARDQ_TLS_CA_FILE`).
    - `prefetch`: jobs leased ahead of the free handlers, kept in a local buffer so a handler
      never waits for a round trip. The worker never holds more than `concurrency + prefetch`
      unfinished jobs, and pulls again when the buffer is down to half of `prefetch`. A job
      waiting in the buffer has its lease renewed by the heartbeats, is started only while
      that lease is surely still its own (else it is skipped, counted in `stats.expired`, and
      the server hands it out again), and is given back to the queue at once on `close()`.
      A prefetched job's `timeout` counts from the pull. 0 pulls only for free handlers
      (best for long jobs shared by many workers).
    - `prefetch_max`: above `prefetch`, the buffer grows for fast jobs: when two pulls'
      replies in a row find the buffer empty (the handlers ran out of jobs during the round
      trips) and the queue had more, the next pulls ask for twice as many, up to
      `prefetch_max`; when a reply finds more than a quarter of that still waiting, it
      halves again, down to `prefetch`. Slow jobs never grow it. The worker then holds at
      most `concurrency + prefetch_max` unfinished jobs. None (the default): a fixed
      `prefetch`.
    - `ack_batch`: buffer ACKs and send them as one ACKB when `ack_batch_size` are waiting,
      `ack_flush_interval` seconds after the first, with the next pull (in the same write,
      ahead of it), and on close. A crash loses at most the unsent ACKs: those jobs run
      again (at-least-once). False sends one ACK per job as soon as its handler returns.
    - `lock_ttl_ms`: the lease each pulled job gets (bunqueue's default, 30 s).
    - `heartbeat_interval`: seconds between lease renewals (default a third of the TTL, so
      two renewals can be lost before a lease lapses).
    - `poll_timeout_ms`: how long a PULLB waits at the server for work. A ZeroMQ worker's
      close waits out a pending poll (to release what it gets), so keep it short.
    - `close_grace`: seconds `close()` lets running handlers finish before releasing jobs.
    - `retry`: backoff for pulls after transient errors (retried until closed).
    - `completion_attempts`: tries of an ACK/FAIL on transient errors (both are safe to
      resend: a second one of the same delivery is a no-op).
    - `owner`: the lease owner name, also the worker's id in the server's worker registry
      (default host:pid:random).
    - `name`: the name `ListWorkers` shows (default: `owner`).
    - `register`: send `RegisterWorker` when connected (again after a reconnect), a worker
      `Heartbeat` every 10 s, and `UnregisterWorker` on close, as bunqueue's workers do.
    """

    concurrency: int = 1
    url: str = DEFAULT_URL
    token: str | None = None
    zmq_server_key: str | None = None
    tls_ca_file: str | None = None
    tls_context: ssl.SSLContext | None = None
    prefetch: int = DEFAULT_PREFETCH
    prefetch_max: int | None = None
    ack_batch: bool = True
    ack_batch_size: int = 100
    ack_flush_interval: float = 0.005
    lock_ttl_ms: int = 30_000
    heartbeat_interval: float | None = None
    poll_timeout_ms: int = 2_000
    close_grace: float = 30.0
    timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    retry: RetryPolicy = PULL_RETRY
    completion_attempts: int = 20
    owner: str = field(default_factory=_default_owner)
    name: str | None = None
    register: bool = True

    def __post_init__(self) -> None:
        parse_url(self.url)
        checks = [
            ("concurrency", _is_int(self.concurrency) and self.concurrency >= 1, "an int >= 1"),
            ("prefetch", _is_int(self.prefetch) and 0 <= self.prefetch <= MAX_PREFETCH,
             f"an int in 0..{MAX_PREFETCH}"),
            ("prefetch_max", self.prefetch_max is None or (_is_int(self.prefetch_max)
             and _is_int(self.prefetch) and self.prefetch <= self.prefetch_max <= MAX_PREFETCH),
             f"None or an int in prefetch..{MAX_PREFETCH}"),
            ("ack_batch", isinstance(self.ack_batch, bool), "a bool"),
            ("ack_batch_size", _is_int(self.ack_batch_size) and 1 <= self.ack_batch_size <= 1000,
             "an int in 1..1000"),
            ("ack_flush_interval", _is_number(self.ack_flush_interval)
             and 0 < self.ack_flush_interval < math.inf, "seconds > 0"),
            ("lock_ttl_ms", _is_int(self.lock_ttl_ms) and self.lock_ttl_ms > 0, "an int > 0"),
            ("heartbeat_interval", self.heartbeat_interval is None
             or (_is_number(self.heartbeat_interval) and self.heartbeat_interval > 0),
             "None or seconds > 0"),
            ("poll_timeout_ms", _is_int(self.poll_timeout_ms)
             and 0 <= self.poll_timeout_ms <= 60_000, "an int in 0..60000"),
            ("close_grace", _is_number(self.close_grace) and self.close_grace >= 0,
             "seconds >= 0"),
            ("completion_attempts", _is_int(self.completion_attempts)
             and self.completion_attempts >= 1, "an int >= 1"),
            ("owner", isinstance(self.owner, str) and bool(self.owner), "a non-empty str"),
            ("name", self.name is None or (isinstance(self.name, str) and bool(self.name)),
             "None or a non-empty str"),
            ("register", isinstance(self.register, bool), "a bool"),
        ]  # fmt: skip
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(
                    f"worker setting {name} must be {expected}, got {getattr(self, name)!r}"
                )

    @property
    def heartbeat_s(self) -> float:
        """Seconds between lease renewals."""
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval
        return self.lock_ttl_ms / 3000

    @property
    def worker_name(self) -> str:
        """The name the worker registers under."""
        return self.name or self.owner


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
