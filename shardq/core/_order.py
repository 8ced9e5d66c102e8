"""The completed jobs' order: their ids in completion order, 8 bytes an entry.

The engine keeps the newest `max_completed` (50,000) completed jobs and evicts the oldest
first (`_tables.trim_completed`, and by age `Timers._expire_completed`), so it keeps their
ids in completion order. An `OrderedDict` did that at 91 bytes an id (its hash table, its
entries and a linked-list node each); this is a `deque` of the ids, 8 bytes each, and
what the deque cannot do cheaply, taking an id out of the middle (a completed job removed,
retried or cleaned), is done lazily: the id is counted in `_gone` and its entry skipped
when the front reaches it, or dropped when the deque is rebuilt.

It relies on what the job store guarantees: an id is in the order at most once as a live
entry (a job enters the completed state only from another state), and `discard` is called
only for an id whose live entry is in the order. An id that left and came back has its
stale entry before its live one, so the front always meets the stale ones first.
Stale entries never outnumber the live ones by more than `_SLACK`: past that the deque is
rebuilt without them, so its size stays bounded by twice the live count plus `_SLACK`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Final

__all__ = ["CompletedOrder"]

# Stale entries tolerated beyond the live count before a rebuild (see above).
_SLACK: Final = 64


class CompletedOrder:
    """Ids in completion order, with lazy removal from the middle (see above)."""

    __slots__ = ("_gone", "_ids", "_live", "_stale")

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._ids: deque[str] = deque(ids)
        self._gone: dict[str, int] = {}
        self._live = len(self._ids)
        self._stale = 0

    def __len__(self) -> int:
        return self._live

    def __bool__(self) -> bool:
        return self._live > 0

    def __iter__(self) -> Iterator[str]:
        """The live ids, oldest first."""
        if not self._stale:
            yield from self._ids
            return
        skip = dict(self._gone)
        for job_id in self._ids:
            left = skip.get(job_id)
            if left:
                skip[job_id] = left - 1
                continue
            yield job_id

    def newest(self) -> Iterator[str]:
        """The ids, newest first, stale entries included (a reader looks each one up)."""
        return reversed(self._ids)

    def append(self, job_id: str) -> None:
        self._ids.append(job_id)
        self._live += 1

    def extend(self, job_ids: list[str]) -> None:
        """`append` of each of `job_ids`, in order (a batch completed together)."""
        self._ids.extend(job_ids)
        self._live += len(job_ids)

    def discard(self, job_id: str) -> None:
        """Take `job_id`'s live entry out of the order (it must be there)."""
        self._gone[job_id] = self._gone.get(job_id, 0) + 1
        self._live -= 1
        self._stale += 1
        if self._stale > self._live + _SLACK:
            self.compact()

    def oldest(self) -> str:
        """The oldest live id (the order must not be empty); stale entries before it go."""
        self._drop_stale()
        return self._ids[0]

    def pop_oldest(self) -> str:
        """Remove and return the oldest live id (the order must not be empty)."""
        self._drop_stale()
        self._live -= 1
        return self._ids.popleft()

    def _drop_stale(self) -> None:
        ids, gone = self._ids, self._gone
        while gone:
            job_id = ids[0]
            left = gone.get(job_id)
            if not left:
                return
            ids.popleft()
            self._stale -= 1
            if left == 1:
                del gone[job_id]
            else:
                gone[job_id] = left - 1

    def compact(self) -> None:
        """Rebuild the deque with the live ids only."""
        if self._stale:
            self._ids = deque(iter(self))
            self._gone.clear()
            self._stale = 0
