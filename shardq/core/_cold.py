"""The cold backlog as the engine reads it: the reads a storage must answer, and their orders.

Under a head budget (`EngineConfig.head_jobs`, `_head.py`) a queue keeps only its head in
memory: the next jobs in delivery order. The rest are "cold": the engine emitted them to
storage marked `cold` (`rec["cold"] = 1` on their `put`, or `("upd", key, {"cold": 1})` when
it dropped a job it held) and pages them back in, in order, through the reads below. The
storage implements them (`shardq.storage`); core imports nothing of it, so the reads and the
page and count they return are declared here as protocols, structurally.

The orders, and the cursors that name a position in them (the delivery order of the
engine's heaps, `_queue.py` and `_state.py`, written with values the storage can index):

- waiting ungrouped jobs: `(-priority, -lifo, -seq if lifo else run_at, seq, row key)`;
- delayed jobs: `(run_at, seq, row key)`;
- waiting jobs of one group: `(priority, run_at, seq, row key)`.

A cursor is the key of the last job paged in; a page is what comes strictly after it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from ._job import Job
from ._mutations import Record

__all__ = [
    "ColdBacklog",
    "ColdCounts",
    "ColdPage",
    "Cursor",
    "delayed_cursor",
    "group_cursor",
    "waiting_cursor",
]

Cursor = tuple[Any, ...]


class ColdPage(Protocol):
    """One page of cold jobs in order."""

    @property
    def records(self) -> Sequence[Record]:
        """The jobs' records (the stored record with its updates merged), in order."""

    @property
    def after(self) -> Cursor | None:
        """The cursor of the last record read (stale ones included); None if empty."""

    @property
    def done(self) -> bool:
        """True if nothing came after this page when it was read."""


class ColdCounts(Protocol):
    """A queue's cold waiting and delayed jobs, in total and per group."""

    @property
    def waiting(self) -> int: ...

    @property
    def delayed(self) -> int: ...

    @property
    def group_waiting(self) -> Mapping[str, int]: ...

    # Optional, read if present: the ungrouped waiting jobs with a priority above 0 (the
    # engine's `prioritized` count, which GetJobCounts reports apart from waiting).

    @property
    def group_delayed(self) -> Mapping[str, int]: ...


class ColdBacklog(Protocol):
    """The reads of the cold backlog. Each sees the jobs stored with `cold` 1 as of the
    storage's last commit; the engine merges what it emitted since (`_head.ColdHead`).
    A page is bounded by `limit` records and about `max_bytes` of stored bytes."""

    def page_waiting(
        self, queue: str, after: Cursor | None = None, *, limit: int, max_bytes: int = ...
    ) -> ColdPage:
        """The next ungrouped waiting jobs of `queue` strictly after `after`."""

    def page_group(
        self,
        queue: str,
        group: str,
        after: Cursor | None = None,
        *,
        limit: int,
        max_bytes: int = ...,
    ) -> ColdPage:
        """The next waiting jobs of one group of `queue`."""

    def page_delayed(
        self, queue: str, after: Cursor | None = None, *, limit: int, max_bytes: int = ...
    ) -> ColdPage:
        """The next delayed jobs of `queue` by run time, then seq."""

    def page_made(
        self,
        queue: str,
        kinds: Collection[str],
        after: Cursor | None = None,
        *,
        limit: int,
        desc: bool = ...,
        max_bytes: int = ...,
    ) -> ColdPage:
        """The next jobs of `queue` of the public states `kinds` ("waiting", "prioritized",
        "delayed") by (created at, seq, row key), reversed if `desc` (GetJobs' order)."""

    def page_by_seq(
        self,
        queue: str,
        kinds: Collection[str],
        after: Cursor | None = None,
        *,
        limit: int,
        made_by: int | None = ...,
        max_bytes: int = ...,
    ) -> ColdPage:
        """The next jobs of `queue` of the public states `kinds` by (seq, row key), created
        at or before `made_by` if given (Clean's order)."""

    def get_by_custom_id(self, queue: str, custom_id: str) -> Record | None:
        """The stored job of `queue` pushed with this custom id, or None."""

    def find_unique(self, queue: str, unique_key: str, *, limit: int = ...) -> list[Record]:
        """Stored jobs of `queue` with this uniqueKey, any state, oldest first."""

    def cold_counts(self, queue: str) -> ColdCounts:
        """The queue's stored cold waiting and delayed jobs (a shard's start)."""

    def cold_priorities(self, queue: str) -> Mapping[int | float, int]:
        """The stored cold ungrouped waiting and cold delayed jobs of `queue` by priority."""

    def get_job(self, job_id: str) -> Record | None:
        """The stored record whose row key is `job_id`, or None."""


def waiting_cursor(job: Job) -> Cursor:
    """Where a waiting ungrouped job sorts (the same order as its ready-heap key)."""
    if job.lifo:
        return (-job.priority, -1, -job.seq, job.seq, job.key)
    return (-job.priority, 0, job.run_at, job.seq, job.key)


def delayed_cursor(job: Job) -> Cursor:
    """Where a delayed job sorts (the same order as its delayed-heap key)."""
    return (job.run_at, job.seq, job.key)


def group_cursor(job: Job) -> Cursor:
    """Where a waiting job sorts in its group."""
    return (job.priority, job.run_at, job.seq, job.key)
