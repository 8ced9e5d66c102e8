"""Requests a shard parks: long-poll pulls waiting for work and WaitJob waiting for completion.

Both are plain bookkeeping with deadlines; the shard decides when to retry them. Nothing here
touches a socket or reads the clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shardq.core import Engine, Job, Mutation, job_id_of

__all__ = ["JobWaits", "LongPolls", "Parked", "job_status", "note_wakeups"]


class Parked:
    """One parked request: who asked, the command, and when it gives up."""

    __slots__ = ("cmd", "conn", "deadline", "key", "live", "rid", "wire")

    def __init__(
        self,
        conn: str,
        rid: int,
        cmd: dict[str, Any],
        key: str,
        deadline: int,
        wire: object = None,
    ) -> None:
        self.conn = conn
        self.rid = rid
        self.cmd = cmd
        self.key = key  # the queue (long-poll) or the job id (WaitJob)
        self.deadline = deadline
        self.wire = wire  # a PULLB's wire mode, from its envelope (`pass_through`)
        self.live = True


class _Deadlines:
    """A heap of parked requests by deadline, with lazy deletion of answered ones."""

    def __init__(self) -> None:
        # The heap (read it, never change it): empty, nothing is parked and `next` is None.
        self.heap: list[tuple[int, int, Parked]] = []
        self._order = itertools.count()

    def add(self, parked: Parked) -> None:
        heapq.heappush(self.heap, (parked.deadline, next(self._order), parked))

    def next(self) -> int | None:
        heap = self.heap
        while heap and not heap[0][2].live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def due(self, now: int) -> list[Parked]:
        """Pop the live entries whose deadline is at or before `now`, oldest first."""
        heap, out = self.heap, []
        while heap and heap[0][0] <= now:
            parked = heapq.heappop(heap)[2]
            if parked.live:
                out.append(parked)
        return out

    def clear(self) -> None:
        self.heap.clear()


class LongPolls:
    """PULL/PULLB requests that found no job, waiting per queue in arrival order (FIFO)."""

    def __init__(self) -> None:
        self._by_queue: dict[str, deque[Parked]] = {}
        self._deadlines = _Deadlines()
        # Their deadlines' heap (read it, never change it): the shard's poll looks at it first.
        self.deadlines = self._deadlines.heap
        # How many are parked (read it, never set it): an attribute, not only `len()`, as the
        # shard tests it for every command (`ShardCore._absorb`) and a call costs more.
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def park(self, parked: Parked) -> None:
        self._by_queue.setdefault(parked.key, deque()).append(parked)
        self._deadlines.add(parked)
        self.count += 1

    def waiting_on(self, queue: str) -> bool:
        return queue in self._by_queue

    def next_deadline(self) -> int | None:
        return self._deadlines.next()

    def retry(self, queue: str, attempt: Callable[[Parked], bool]) -> None:
        """Offer `queue`'s work to its waiters, oldest first, until one gets nothing.

        `attempt` answers the request and returns True, or returns False when there was
        nothing to hand out; that waiter keeps its place and the later ones are not tried.
        """
        waiters = self._by_queue.get(queue)
        while waiters:
            parked = waiters[0]
            if not attempt(parked):
                return
            self._forget(waiters.popleft())
        self._by_queue.pop(queue, None)

    def expire(self, now: int) -> list[Parked]:
        """Remove and return the waiters whose deadline has passed."""
        due = self._deadlines.due(now)
        for parked in due:
            self._remove(parked)
        return due

    def drop_conn(self, conn: str) -> list[Parked]:
        """Remove and return every waiter of a closed connection."""
        dropped = [p for p in self._all() if p.conn == conn]
        for parked in dropped:
            self._remove(parked)
        return dropped

    def take_all(self) -> list[Parked]:
        """Remove and return every waiter, in queue order (drain answers them empty)."""
        everyone = list(self._all())
        for parked in everyone:
            parked.live = False
        self._by_queue.clear()
        self._deadlines.clear()
        self.count = 0
        return everyone

    def _all(self) -> Iterator[Parked]:
        for waiters in self._by_queue.values():
            yield from waiters

    def _forget(self, parked: Parked) -> None:
        parked.live = False
        self.count -= 1

    def _remove(self, parked: Parked) -> None:
        waiters = self._by_queue.get(parked.key)
        if waiters is not None:
            # O(waiters of this queue); expiry and closes are rare next to retries.
            waiters.remove(parked)
            if not waiters:
                del self._by_queue[parked.key]
        self._forget(parked)


class JobWaits:
    """WaitJob requests, by job id, until the job completes or the deadline passes."""

    def __init__(self) -> None:
        # The waits by job id (read it, never change it): the shard tests it for every
        # command (`ShardCore._absorb`), where `bool(self)` would cost a call.
        self.by_job: dict[str, list[Parked]] = {}
        self._deadlines = _Deadlines()
        # Their deadlines' heap (read it, never change it): the shard's poll looks at it first.
        self.deadlines = self._deadlines.heap

    def __bool__(self) -> bool:
        return bool(self.by_job)

    def park(self, parked: Parked) -> None:
        self.by_job.setdefault(parked.key, []).append(parked)
        self._deadlines.add(parked)

    def waiting_for(self, job_id: str) -> bool:
        return job_id in self.by_job

    def next_deadline(self) -> int | None:
        return self._deadlines.next()

    def take(self, job_id: str) -> list[Parked]:
        """Remove and return the waiters of `job_id`."""
        waiters = self.by_job.pop(job_id, [])
        for parked in waiters:
            parked.live = False
        return waiters

    def expire(self, now: int) -> list[Parked]:
        due = self._deadlines.due(now)
        for parked in due:
            parked.live = False
            waiters = self.by_job.get(parked.key, [])
            waiters.remove(parked)
            if not waiters:
                self.by_job.pop(parked.key, None)
        return due

    def take_gone(self, present: Callable[[str], bool]) -> list[Parked]:
        """Remove and return the waiters of the jobs not `present` any more (their queue
        left this shard with its partition)."""
        gone: list[Parked] = []
        for job_id in [j for j in self.by_job if not present(j)]:
            gone.extend(self.take(job_id))
        return gone

    def drop_conn(self, conn: str) -> list[Parked]:
        """Remove and return every waiter of a closed connection."""
        dropped = []
        for job_id in list(self.by_job):
            kept = []
            for parked in self.by_job[job_id]:
                if parked.conn == conn:
                    parked.live = False
                    dropped.append(parked)
                else:
                    kept.append(parked)
            if kept:
                self.by_job[job_id] = kept
            else:
                del self.by_job[job_id]
        return dropped


def note_wakeups(
    woken: set[str],
    muts: list[Mutation],
    events: Iterable[tuple[str, str, str]],
    find: Callable[[str], Job | None],
) -> None:
    """Add to `woken` the queues that may have deliverable work now, for their parked
    long-polls: "ready" events and jobs made waiting (`find` looks a job up by id)."""
    for kind, queue, _job_id in events:
        if kind == "ready":
            woken.add(queue)
    for m in muts:
        kind = m[0]
        if kind == "put" and m[1].get("state") == "waiting":
            woken.add(m[1]["queue"])
        elif kind == "upd" and m[2].get("state") == "waiting":
            job = find(job_id_of(m[1]))
            if job is not None:
                woken.add(job.queue)
        elif kind == "queue":
            woken.add(m[1])


def job_status(engine: Engine, job_id: object) -> dict[str, Any] | None:
    """WaitJob's answer if it is final now, None while the job may still complete."""
    job = engine.find(job_id)
    if job is None:
        if isinstance(job_id, str) and engine.store.is_completed(job_id):
            return {"ok": True, "completed": True, "result": None}
        return {"ok": False, "error": "Job not found"}
    if job.state == "completed":
        return {"ok": True, "completed": True, "result": job.result if job.has_result else None}
    return None
