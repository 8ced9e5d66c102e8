"""What every listening port shares so that it cannot be starved (docs/operations.md, "Ports").

- `connection_cap`: a port's connection cap never exceeds the process's descriptor limit minus
  `reserved_fds`, so that at the cap the process still has descriptors to accept one more
  connection (to evict an idle one for it), to answer a probe and to keep its internal links.
- `AuthThrottle`: failed `Auth` attempts counted per source address, whatever the port or the
  connection. Past `free` failures within `window_s` every later attempt from the address waits
  its turn: `delay_s`, doubled with each further failure up to `max_delay_s`. Attempts sent at
  once are served one after the other, so opening more connections (or more ZeroMQ
  identities, or more HTTP requests) buys an attacker nothing.
"""

from __future__ import annotations

import resource
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

__all__ = ["AuthThrottle", "connection_cap", "descriptor_limit"]

# Addresses whose failures are remembered; past it the least recently failing is forgotten.
MAX_ADDRESSES: Final = 100_000


def descriptor_limit() -> int:
    """The process's soft RLIMIT_NOFILE (a large number when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def connection_cap(configured: int, reserved_fds: int) -> int:
    """`configured`, or fewer so that `reserved_fds` descriptors stay free (at least 1)."""
    return max(1, min(configured, descriptor_limit() - reserved_fds))


@dataclass(slots=True)
class _Record:
    failures: int
    last_failure: float
    next_at: float  # when the next attempt from this address may be checked
    queued: int = 0  # attempts given a turn and not checked yet


class AuthThrottle:
    """Per-address failed-Auth bookkeeping with growing delays (times are monotonic seconds)."""

    def __init__(
        self,
        free: int,
        window_s: float,
        delay_s: float,
        max_delay_s: float,
        size: int = MAX_ADDRESSES,
    ) -> None:
        self._free = free
        self._window = window_s
        self._delay = delay_s
        self._max_delay = max_delay_s
        self._size = size
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def _live(self, address: str, now: float) -> _Record | None:
        record = self._records.get(address)
        if record is not None and now - record.last_failure > self._window:
            del self._records[address]  # quiet for a whole window: forgiven
            return None
        return record

    def _step(self, failures: int) -> float:
        over = failures - self._free
        if over < 0 or self._delay <= 0:
            return 0.0
        return float(min(self._delay * 2.0 ** min(over, 40), self._max_delay))

    def reserve(self, address: str, now: float) -> float:
        """Seconds the attempt from `address` at `now` must wait before it is checked (0: at
        once). Each call takes the next free turn, so concurrent attempts queue up; an attempt
        whose turn is more than `max_delay_s` away gets -1: refuse it unchecked (the queue of
        waiting attempts stays bounded)."""
        record = self._live(address, now)
        if record is None:
            return 0.0
        # Each attempt still waiting counts as the failure it most likely is: concurrent
        # attempts are spaced as if they had come one after the other.
        step = self._step(record.failures + record.queued)
        if step <= 0:
            return 0.0
        at = max(now, record.next_at)
        if at - now > self._max_delay:
            return -1.0
        record.next_at = at + step
        record.queued += 1
        return at - now

    def settled(self, address: str) -> None:
        """An attempt given a turn by `reserve` was checked and matched."""
        record = self._records.get(address)
        if record is not None and record.queued:
            record.queued -= 1

    def failed(self, address: str, now: float) -> int:
        """Count one failure of `address`; return its failures in the current window."""
        record = self._live(address, now)
        if record is None:
            record = self._records[address] = _Record(0, now, now)
        else:
            self._records.move_to_end(address)
            record.queued = max(0, record.queued - 1)
        record.failures += 1
        record.last_failure = now
        record.next_at = max(record.next_at, now + self._step(record.failures))
        if len(self._records) > self._size:
            self._records.popitem(last=False)
        return record.failures

    def failures(self, address: str, now: float) -> int:
        record = self._live(address, now)
        return 0 if record is None else record.failures

    def __len__(self) -> int:
        return len(self._records)
