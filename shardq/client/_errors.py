"""The client's errors, a branch of `shardq.errors.ShardqError`.

    ShardqError
    ├── ClientError                   anything the client raises on its own account
    │   ├── ConnectionLost            no connection, or it broke (`sent` says if a request left)
    │   ├── CommandTimeout            no reply in time (also a `TimeoutError`)
    │   ├── ClientClosed              the client was closed by its owner
    │   ├── SerializationError        a value msgpack cannot encode (also a `TypeError`)
    │   ├── WaitTimeout               a wait (`join`, `wait_until_finished`) ran out
    │   ├── JobFailed                 a job that was waited for ended in the DLQ
    │   ├── DeadLettered              `join` found jobs in the queue's DLQ
    │   └── ServerError               the server answered `ok: false`; `str()` is its message
    │       ├── NotFound              ... and the message says "not found"
    │       ├── AuthenticationFailed  "Invalid token" / "Not authenticated"
    │       ├── LeaseLost             the job's lease is gone (token stale, or not active)
    │       └── TransientServerError  a refusal worth retrying
    │           ├── RateLimited           "Rate limit exceeded"
    │           ├── InternalServerError   "Internal server error"
    │           └── StorageUnavailable    "Storage unavailable: ..."
    └── UnrecoverableError            raised by a handler: fail the job without retries

Only the allowlist in `TRANSIENT_ERRORS` is ever retried (trio's `ACCEPT_CAPACITY_ERRNOS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from shardq.errors import ShardqError
from shardq.protocol import (
    INTERNAL_SERVER_ERROR,
    INVALID_TOKEN,
    NOT_AUTHENTICATED,
    RATE_LIMIT_EXCEEDED,
)

__all__ = [
    "TRANSIENT_ERRORS",
    "AuthenticationFailed",
    "ClientClosed",
    "ClientError",
    "CommandTimeout",
    "ConnectionLost",
    "DeadLettered",
    "InternalServerError",
    "JobFailed",
    "LeaseLost",
    "NotFound",
    "RateLimited",
    "SerializationError",
    "ServerError",
    "StorageUnavailable",
    "TransientServerError",
    "UnrecoverableError",
    "WaitTimeout",
    "error_from_reply",
    "is_transient",
]


class ClientError(ShardqError):
    """Root of the errors the client raises."""


class ConnectionLost(ClientError):
    """There is no usable connection: connect failed, or the connection broke.

    `sent` is False when the request certainly never reached the server (so even a command
    that is not idempotent may be sent again), True when it may have been applied.
    """

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class CommandTimeout(ClientError, TimeoutError):
    """No reply came within the command timeout. The server may still apply the command."""


class ClientClosed(ClientError):
    """The connection, queue or worker was closed by its owner and cannot be used again."""


class SerializationError(ClientError, TypeError):
    """A command holds a value msgpack cannot encode (job data, a result, an option)."""


class WaitTimeout(ClientError, TimeoutError):
    """A wait for a state of the queue (or of a job) did not end in time."""


class JobFailed(ClientError):
    """A job that was waited for was dead-lettered; `reason` is its failed reason."""

    def __init__(self, job_id: str, reason: str | None) -> None:
        super().__init__(f"job {job_id} failed: {reason}")
        self.job_id = job_id
        self.reason = reason


class DeadLettered(ClientError):
    """`join` found jobs in the queue's DLQ; `jobs` holds `(job id, failed reason)` pairs."""

    def __init__(self, queue: str, jobs: list[tuple[str, str | None]]) -> None:
        shown = ", ".join(f"{job_id} ({reason})" for job_id, reason in jobs[:5])
        more = f" and {len(jobs) - 5} more" if len(jobs) > 5 else ""
        super().__init__(f"queue {queue!r} dead-lettered {len(jobs)} job(s): {shown}{more}")
        self.queue = queue
        self.jobs = jobs


class ServerError(ClientError):
    """The server refused a command (`ok: false`); `str(err)` is its exact error string.

    `reply` is the whole reply map (without `reqId`), or None when it was not kept.
    """

    def __init__(self, message: str, reply: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reply = reply


class NotFound(ServerError):
    """The job (or other thing) the command named does not exist."""


class AuthenticationFailed(ServerError):
    """The server refused the token, or a command was sent without `Auth`."""


class LeaseLost(ServerError):
    """The job's lease is gone: it was redelivered, finished, or its token is stale."""


class TransientServerError(ServerError):
    """A refusal that says nothing about the command itself; trying again later may work."""


class RateLimited(TransientServerError):
    """The server's per-connection rate limit refused the command (it was not applied)."""


class InternalServerError(TransientServerError):
    """The server hid a storage or network failure behind "Internal server error"."""


class StorageUnavailable(TransientServerError):
    """The server could not commit a durable write ("Storage unavailable: <reason>")."""


class UnrecoverableError(ShardqError):
    """Raise from a handler to fail the job at once, to the DLQ, without further attempts."""


TRANSIENT_ERRORS: Final = (ConnectionLost, CommandTimeout, TransientServerError)
"""The allowlist of retryable errors; everything else is final."""

# Lease refusals of ACK/FAIL/ACKB/MoveToWait (docs/protocol.md §6.2), by prefix.
_LEASE_PREFIXES: Final = (
    "Lock token required for job",
    "Invalid or expired lock token for job",
    "Job not found or not in processing state",
    "Job not found or not active",
)
_STORAGE_PREFIX: Final = "Storage unavailable"
_LOCK_TIMEOUT: Final = "Lock acquisition timed out"  # bunqueue: transient (docs/protocol.md §13.3)


def error_from_reply(reply: Mapping[str, Any]) -> ServerError:
    """The `ServerError` subclass for an `ok: false` reply, carrying its message."""
    message = str(reply.get("error") or "unknown server error")
    kind: type[ServerError] = ServerError
    if message == RATE_LIMIT_EXCEEDED:
        kind = RateLimited
    elif message in (INTERNAL_SERVER_ERROR, _LOCK_TIMEOUT):
        kind = InternalServerError
    elif message.startswith(_STORAGE_PREFIX):
        kind = StorageUnavailable
    elif message in (INVALID_TOKEN, NOT_AUTHENTICATED):
        kind = AuthenticationFailed
    elif message.startswith(_LEASE_PREFIXES):
        kind = LeaseLost
    elif "not found" in message.lower():
        kind = NotFound
    return kind(message, {k: v for k, v in reply.items() if k != "reqId"})


def is_transient(error: BaseException) -> bool:
    """True for the errors on the retry allowlist (`TRANSIENT_ERRORS`)."""
    return isinstance(error, TRANSIENT_ERRORS)
