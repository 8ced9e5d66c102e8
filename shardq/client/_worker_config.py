"""A worker's settings: one frozen, validated `WorkerConfig` (arq's `RedisSettings` style)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Final, TypedDict

from shardq.client._connection import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT
from shardq.client._retry import RetryPolicy
from shardq.client._url import DEFAULT_URL, parse_url

__all__ = ["WorkerConfig", "WorkerOptions"]

# A worker keeps pulling through a server restart, however long: retry until closed, backing
# off to 2 s so a fleet of workers does not hammer a server that is coming back.
PULL_RETRY: Final = RetryPolicy(attempts=None, base_delay=0.05, max_delay=2.0)


def _default_owner() -> str:
    # Unique per worker: the server fences leases by token, the owner names who holds them.
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class WorkerOptions(TypedDict, total=False):
    """Keyword options of `Worker` and `AsyncWorker` (see `WorkerConfig` for each)."""

    token: str | None
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


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker is told; `ValueError` names a setting out of range.

    - `concurrency`: handlers running at once (and the most jobs ever held).
    - `url`, `token`, `timeout`, `connect_timeout`: as for `Connection`.
    - `ack_batch`: buffer ACKs and send them as one ACKB per `ack_batch_size` completions or
      `ack_flush_interval` seconds, whichever comes first; flushed on close.
    - `lock_ttl_ms`: the lease each pulled job gets (bunqueue's default, 30 s).
    - `heartbeat_interval`: seconds between lease renewals (default a third of the TTL, so
      two renewals can be lost before a lease lapses).
    - `poll_timeout_ms`: how long a PULLB waits at the server for work. A ZeroMQ worker's
      close waits out a pending poll (to release what it gets), so keep it short.
    - `close_grace`: seconds `close()` lets running handlers finish before releasing jobs.
    - `retry`: backoff for pulls after transient errors (retried until closed).
    - `completion_attempts`: tries of an ACK/FAIL on transient errors (both are safe to
      resend: a second one of the same delivery is a no-op).
    - `owner`: the lease owner name (default host:pid:random).
    """

    concurrency: int = 1
    url: str = DEFAULT_URL
    token: str | None = None
    ack_batch: bool = False
    ack_batch_size: int = 100
    ack_flush_interval: float = 0.05
    lock_ttl_ms: int = 30_000
    heartbeat_interval: float | None = None
    poll_timeout_ms: int = 2_000
    close_grace: float = 30.0
    timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    retry: RetryPolicy = PULL_RETRY
    completion_attempts: int = 20
    owner: str = field(default_factory=_default_owner)

    def __post_init__(self) -> None:
        parse_url(self.url)
        checks = [
            ("concurrency", self.concurrency >= 1),
            ("ack_batch_size", 1 <= self.ack_batch_size <= 1000),
            ("ack_flush_interval", self.ack_flush_interval > 0),
            ("lock_ttl_ms", self.lock_ttl_ms > 0),
            ("heartbeat_interval", (self.heartbeat_interval or 1) > 0),
            ("poll_timeout_ms", 0 <= self.poll_timeout_ms <= 60_000),
            ("close_grace", self.close_grace >= 0),
            ("completion_attempts", self.completion_attempts >= 1),
            ("owner", bool(self.owner)),
        ]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"worker setting {name} is out of range: {getattr(self, name)!r}")

    @property
    def heartbeat_s(self) -> float:
        """Seconds between lease renewals."""
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval
        return self.lock_ttl_ms / 3000
