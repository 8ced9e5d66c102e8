"""When to retry a command, and how long to wait first (exponential backoff, full jitter)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from shardq.client._errors import ConnectionLost, RateLimited, is_transient

__all__ = ["RetryPolicy", "may_resend"]


@dataclass(frozen=True)
class RetryPolicy:
    """How a client retries the transient errors of `TRANSIENT_ERRORS` (nothing else).

    `attempts` counts tries in all (1 = never retry; None = until the owner closes). The
    wait before try n+1 is uniform in [(1 - jitter) * d, d] with
    d = min(max_delay, base_delay * 2**n): jitter spreads the reconnects of many clients
    after a server restart instead of having them arrive in lockstep.
    """

    attempts: int | None = 5
    base_delay: float = 0.05
    max_delay: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts must be >= 1 or None, got {self.attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("delays must be >= 0")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")

    def delay(self, attempt: int, rand: float | None = None) -> float:
        """Seconds to wait after failed try number `attempt` (0-based); `rand` in [0, 1)."""
        ceiling = min(self.max_delay, self.base_delay * (2 ** min(attempt, 32)))
        r = random.random() if rand is None else rand
        return float(ceiling * (1 - self.jitter * r))

    def allows(self, error: BaseException, attempt: int, *, idempotent: bool) -> bool:
        """True if failed try number `attempt` (0-based) with `error` should be tried again."""
        if self.attempts is not None and attempt + 1 >= self.attempts:
            return False
        return may_resend(error, idempotent=idempotent)


def may_resend(error: BaseException, *, idempotent: bool) -> bool:
    """True if `error` is on the transient allowlist and sending again cannot apply the
    command twice: it is idempotent, or the server certainly did not apply it."""
    if not is_transient(error):
        return False
    if idempotent:
        return True
    unsent = isinstance(error, ConnectionLost) and not error.sent
    return unsent or isinstance(error, RateLimited)
