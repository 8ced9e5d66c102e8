"""The front end's per-connection and per-server bounds (`ServerConfig`, "bounds" block).

Each bound here is bookkeeping only: the TCP and ZeroMQ gateways and the dispatcher decide
what to do when one is reached (docs/runtime.md, "Bounds"). Nothing here touches a socket.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Final

import structlog

from shardq.protocol import RATE_LIMIT_EXCEEDED, error_reply
from shardq.protocol._direct import parks
from shardq.protocol._rawpush import RawPush

__all__ = [
    "PARKING_COMMANDS",
    "Failures",
    "LogLimiter",
    "ParkedSlots",
    "RateWindow",
    "parks",
    "rate_refusal",
]


PARKING_COMMANDS: Final = frozenset({"PULL", "PULLB", "WaitJob"})

_log = structlog.get_logger()


class RateWindow:
    """bunqueue's per-connection limiter: at most `limit` frames per `window_ms`.

    A fixed window (the count restarts when the window has passed) rather than bunqueue's
    sliding one: one comparison per frame, and the same sustained rate.
    """

    __slots__ = ("_count", "_limit", "_reset_at", "_window")

    def __init__(self, window_ms: int, limit: int) -> None:
        self._window = window_ms / 1000
        self._limit = limit
        self._reset_at = 0.0
        self._count = 0

    def allow(self, now: float) -> bool:
        """Count one frame at monotonic time `now`; False if it is over the limit."""
        if now >= self._reset_at:
            self._reset_at = now + self._window
            self._count = 0
        self._count += 1
        return self._count <= self._limit


def rate_refusal(frame: object) -> dict[str, Any]:
    """The answer to a frame over the rate limit, echoing its `reqId` as bunqueue does."""
    reply = error_reply(RATE_LIMIT_EXCEEDED)
    if isinstance(frame, dict) and "reqId" in frame:
        reply["reqId"] = frame["reqId"]
    elif isinstance(frame, RawPush) and frame.has_req:
        reply["reqId"] = frame.req
    return reply


class ParkedSlots:
    """Long-polls that may be parked at once, per connection and for the whole server."""

    def __init__(self, per_connection: int, total: int) -> None:
        self._per_connection = per_connection
        self._total = total
        self._by_conn: dict[str, int] = {}
        self.count = 0

    def take(self, conn: str) -> bool:
        """Take a slot for a long-poll of `conn`; False (nothing taken) past either cap."""
        held = self._by_conn.get(conn, 0)
        if held >= self._per_connection or self.count >= self._total:
            return False
        self._by_conn[conn] = held + 1
        self.count += 1
        return True

    def give_back(self, conn: str) -> None:
        """A long-poll of `conn` was answered."""
        held = self._by_conn.get(conn, 0)
        if held > 1:
            self._by_conn[conn] = held - 1
        elif held:
            del self._by_conn[conn]
        else:
            return
        self.count -= 1

    def held(self, conn: str) -> int:
        return self._by_conn.get(conn, 0)


class LogLimiter:
    """At most one log line per `every_s` for one kind of event, counting those skipped:
    a flood of refused connections or failed Auth must not become a flood of log lines."""

    def __init__(self, event: str, every_s: float = 1.0) -> None:
        self._event = event
        self._every = every_s
        self._next = 0.0
        self._skipped = 0

    def log(self, **fields: Any) -> None:
        now = time.monotonic()
        if now < self._next:
            self._skipped += 1
            return
        self._next = now + self._every
        _log.warning(self._event, suppressed=self._skipped, **fields)
        self._skipped = 0


class Failures:
    """Failed Auth attempts per connection, for the most recent `size` connections (ZeroMQ
    peers have no close event, so the table must forget by itself)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._counts: OrderedDict[str, int] = OrderedDict()

    def add(self, conn: str) -> int:
        """Count one failure of `conn`; return its failures so far."""
        count = self._counts.pop(conn, 0) + 1
        self._counts[conn] = count
        if len(self._counts) > self._size:
            self._counts.popitem(last=False)
        return count

    def count(self, conn: str) -> int:
        return self._counts.get(conn, 0)

    def forget(self, conn: str) -> None:
        self._counts.pop(conn, None)
