"""Paging cold jobs into a queue's head: the half of `ColdHead` (`_head.py`) that reads the
backlog through the pager and holds what it brings in.

A mixin: `ColdHead` sets the attributes declared below and defines the methods named under
`TYPE_CHECKING`; the module docstring of `_head.py` explains the head, its cursors and counts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ._job import Job
from ._lifecycle import DELAYED, WAITING
from ._mutations import Record
from ._pager import MAX_LIMIT, Pager, QueueHead, eligible, job_of, keep_held
from ._queue import QueueState
from ._state import JobStore

__all__ = ["HeadPaging"]


class HeadPaging:
    """Page-ins and lookups that bring cold jobs into memory, for `ColdHead`."""

    store: JobStore
    pager: Pager
    budget: int
    heads: dict[str, QueueHead]
    leaving: list[Job]
    fences: OrderedDict[str, tuple[int, str | None, bool, str]]
    _enter_all: Callable[[Sequence[Job], QueueState, str], None]

    if TYPE_CHECKING:

        def head(self, name: str) -> QueueHead: ...

        def _entered(self, jobs: Sequence[Job], q: QueueState, state: str) -> None: ...

        def _must_leave(self, job: Job) -> bool: ...

        def _back_on_heap(self, job: Job) -> None: ...

    # -- paging in -------------------------------------------------------------------------

    def _page_waiting(self, q: QueueState, h: QueueHead, want: int) -> int:
        """Page in the next cold waiting jobs of `q` (at least `want` if there are);
        returns how many came in."""
        self.pager.sweep(self.heads.values())
        limit = min(MAX_LIMIT, max(want, self.budget - (q.counts[WAITING] - h.waiting), 1))
        jobs, end, empty = self.pager.page(q.name, WAITING, h.wcur, limit)
        for job in jobs:
            h.waiting -= 1
            q.counts[WAITING] -= 1
            self._uncount_priority(q, h, job)
            self._hold(q, h, job)
        self._enter_all(jobs, q, WAITING)
        keep_held(self.store.held, jobs)
        if end is not None:
            h.wcur = end
        self._settled_cursor(q, h, empty, WAITING)
        return len(jobs)

    def _page_delayed(self, q: QueueState, h: QueueHead, want: int) -> int:
        self.pager.sweep(self.heads.values())
        jobs, end, empty = self.pager.page(q.name, DELAYED, h.dcur, min(MAX_LIMIT, max(want, 1)))
        for job in jobs:
            h.delayed -= 1
            q.counts[DELAYED] -= 1
            self._hold(q, h, job)
        self._enter_all(jobs, q, DELAYED)
        if end is not None:
            h.dcur = end
        self._settled_cursor(q, h, empty, DELAYED)
        return len(jobs)

    def _settled_cursor(self, q: QueueState, h: QueueHead, empty: bool, state: str) -> None:
        """After a page: an exhausted backlog whose count says otherwise drifted (a job
        counted cold that no read shows): the count follows the reads. Then the jobs of
        this command waiting to leave that now sort within the head go back on a heap."""
        if state == WAITING:
            if empty and h.waiting:
                q.counts[WAITING] -= h.waiting
                q.prioritized -= h.prioritized
                h.waiting = h.prioritized = 0
            if not h.waiting:
                h.wcur = None
        else:
            if empty and h.delayed:
                q.counts[DELAYED] -= h.delayed
                h.delayed = 0
            if not h.delayed:
                h.dcur = None
        jobs = self.store.jobs
        for job in self.leaving:
            if job.queue != q.name or job.state != state or jobs.get(job.id) is not job:
                continue
            if not self._must_leave(job):
                self._back_on_heap(job)

    def _uncount_priority(self, q: QueueState, h: QueueHead, job: Job) -> None:
        # A cold job with a priority is counted in `prioritized` (entering counts it again),
        # except one counted at start, where the cold counts have no priority split.
        if job.priority > 0 and h.prioritized > 0:
            h.prioritized -= 1
            q.prioritized -= 1

    def _bring_in(self, rec: Record) -> Job | None:
        """Hold one cold job (a lookup): counted as held, placed as any job entering."""
        job = job_of(rec)
        if not eligible(job) or job.id in self.store.jobs:
            return None
        q = self.store.queue(job.queue)
        h = self.head(job.queue)
        if job.state == WAITING:
            h.waiting -= 1
            q.counts[WAITING] -= 1
            self._uncount_priority(q, h, job)
        else:
            h.delayed -= 1
            q.counts[DELAYED] -= 1
        self._hold(q, h, job)
        self._entered((job,), q, job.state)
        keep_held(self.store.held, (job,))
        return job

    def _hold(self, q: QueueState, h: QueueHead, job: Job) -> None:
        if self.fences:
            fence = self.fences.pop(job.id, None)
            if fence is not None:
                job.delivery, job.token, job.leased, _ = fence
        self.store.jobs[job.id] = job
        q.ids[job.id] = None
        h.paged[job.key] = job.id
