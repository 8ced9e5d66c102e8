"""The two rules that skip a due cron slot without firing it (docs/protocol.md §15.4).

- `skipIfNoWorker`: no worker serves the schedule's queue. The engine cannot see workers: the
  runtime tells it which queues have registered workers (`worker_queues`, from the front end's
  registry) and which have a pull waiting on this shard (`pull_waiting`). Both are inputs, so
  the engine stays pure.
- Too soon: the slot comes less than 0.8 intervals after the last fire. The interval is
  `repeatEvery`, or for an expression the distance from the previous slot to this one; the
  fire times compared are the moments jobs were actually pushed (`lastFiredAt`), so a slot
  fired late (at a restart, after a stall) is not followed at once by the next one.

A skipped slot is handled like a fired one (its `lastRun` is stored, it never fires later),
but pushes nothing and does not count toward `executions` or `maxLimit`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = ["MIN_FIRE_GAP", "WorkerPresence", "too_soon"]

# bunqueue's guard against a double fire: a fire closer than this share of the interval to
# the previous one is dropped.
MIN_FIRE_GAP: Final = 0.8


def _never(_queue: str) -> bool:
    return False


def too_soon(rec: Mapping[str, Any], slot: int, now: int) -> bool:
    """Whether firing slot `slot` of `rec` at `now` would follow the last fire too closely."""
    fired_at, previous = rec.get("lastFiredAt"), rec.get("lastRun")
    if fired_at is None or previous is None:
        return False
    interval = rec.get("repeatEvery") or (slot - int(previous))
    return bool(now - int(fired_at) < MIN_FIRE_GAP * interval)


class WorkerPresence:
    """What the engine knows of workers: the queues the runtime says are served."""

    def __init__(self) -> None:
        self.worker_queues: frozenset[str] = frozenset()
        # Set by the shard to its long-poll table's test; an engine alone has no pulls waiting.
        self.pull_waiting: Callable[[str], bool] = _never

    def set_worker_queues(self, queues: object) -> None:
        """The queues that have at least one registered worker (a list; replaces the last)."""
        items = queues if isinstance(queues, list | tuple | set | frozenset) else ()
        self.worker_queues = frozenset(q for q in items if isinstance(q, str))

    def served(self, queue: str) -> bool:
        return queue in self.worker_queues or self.pull_waiting(queue)
