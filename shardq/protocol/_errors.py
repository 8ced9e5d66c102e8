"""The exact transport-level error strings of the bunqueue protocol.

bunqueue's SDKs match on these strings (for example, to tell a transient refusal from a permanent
one), so they are spelled here once and nowhere else.
"""

from __future__ import annotations

__all__ = [
    "INTERNAL_SERVER_ERROR",
    "INVALID_COMMAND",
    "INVALID_COMMAND_FORMAT",
    "INVALID_TOKEN",
    "NOT_AUTHENTICATED",
    "RATE_LIMIT_EXCEEDED",
    "WAIT_MOVED",
    "frame_too_large",
    "unknown_command",
]

INVALID_COMMAND_FORMAT = "Invalid command format"
"""The body is not msgpack, or not a map with string keys. Sent without `reqId`."""

INVALID_COMMAND = "Invalid command"
"""The map has no usable `cmd`."""

RATE_LIMIT_EXCEEDED = "Rate limit exceeded"
NOT_AUTHENTICATED = "Not authenticated"
INVALID_TOKEN = "Invalid token"

WAIT_MOVED = "Partition unavailable: the job's partition moved to another node while waiting; retry"
"""A WaitJob parked on a node that lost the job's partition (docs/cluster.md). The front end
that took the client's WaitJob asks again where the job is now; a client sees it only when
that fails too."""

INTERNAL_SERVER_ERROR = "Internal server error"
"""What a handler failure that looks like a storage or network diagnostic is replaced with."""


def unknown_command(cmd: str) -> str:
    """Return the error for a `cmd` no handler knows, e.g. ``Unknown command: Foo``."""
    return f"Unknown command: {cmd}"


def frame_too_large(size: int, maximum: int) -> str:
    """Return the error for a frame whose declared body length `size` exceeds `maximum`."""
    return f"Frame too large: {size} bytes exceeds maximum {maximum}"
