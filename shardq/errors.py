"""The one error tree of shardq.

Every error shardq raises on purpose derives from `ShardqError`. Errors that a client sees carry
the exact message the bunqueue protocol uses, because bunqueue's SDKs match on those strings.
"""

from __future__ import annotations

__all__ = [
    "CommandError",
    "IllegalTransition",
    "ProtocolError",
    "ShardqError",
]


class ShardqError(Exception):
    """Root of every error shardq raises on purpose."""


class CommandError(ShardqError):
    """A command was refused. `str(err)` is the exact wire error string."""


class IllegalTransition(ShardqError):
    """A job was asked to make a move its lifecycle table forbids."""

    def __init__(self, job_id: str, state: str, event: str) -> None:
        super().__init__(f"job {job_id}: event {event!r} is not allowed in state {state!r}")
        self.job_id = job_id
        self.state = state
        self.event = event


class ProtocolError(ShardqError):
    """Bytes from a peer could not be turned into a command map.

    `fatal` is true when the connection must be closed (an oversize frame); every other
    protocol error is answered and the connection stays open.
    """

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal
        # The request's id when it could still be read (a body with a bad string in it), so
        # the refusal reaches the request it answers.
        self.req_id: str | int | None = None
