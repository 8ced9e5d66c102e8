"""The dead-letter queues' administration (`DeadLetters`, the engine's `dead_letters`
component): Dlq, RetryDlq, PurgeDlq, RemoveDlqJob and GetDlqStats, and the periodic upkeep
that drops entries past their `maxAge` and auto-retries (docs/protocol.md §10 and §21).

A queue's DLQ itself is its `QueueState.dlq` (ids, in entry order), filled by the job store's
`dead` and emptied by its `revive` and `remove`; its settings are the queue's config
(`SetDlqConfig`, with the other queue settings in `_admin`). This component owns `queues`, a
superset of the queues whose DLQ holds entries (the store adds a queue's name whenever a job
enters its DLQ), and `next_check`, the time of the next upkeep pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._config import EngineConfig
from ._effects import Effects
from ._introspect import dlq_stats
from ._job import Job
from ._options import as_int
from ._queue import QueueState
from ._state import JobStore

__all__ = ["DeadLetters"]


class DeadLetters:
    """The DLQ commands and upkeep over the job store's dead-lettered jobs."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.config: EngineConfig = store.config
        self.jobs = store.jobs  # the store's own dicts, never replaced
        self.all_queues = store.queues
        self.queues: set[str] = set()
        self.next_check = 0

    # -- upkeep, run from the timers component's pass, in its place there ---------------

    def tick(self, fx: Effects, now: int) -> None:
        if now >= self.next_check:
            self.maintain(fx, now)
            self.next_check = now + self.config.dlq_maintenance_ms

    def deadline(self) -> int | None:
        """The next upkeep pass, if any DLQ holds an entry."""
        return self.next_check if self.any() else None

    def any(self) -> bool:
        """Whether any queue's DLQ holds an entry, without walking every queue.

        Runs twice per shard turn. `queues` names every queue a job was dead-lettered in;
        the names of queues whose DLQ has emptied (or that are gone) are dropped on the way
        to the first that still holds one.
        """
        live, queues = self.queues, self.all_queues
        stale: list[str] = []
        found = False
        for name in live:
            q = queues.get(name)
            if q is not None and q.dlq:
                found = True
                break
            stale.append(name)
        live.difference_update(stale)
        return found

    def maintain(self, fx: Effects, now: int) -> None:
        """Drop DLQ entries past maxAge and auto-retry entries when the queue asks for it."""
        store = self.store
        for q in list(self.all_queues.values()):
            cfg = q.dlq_config
            for job_id in list(q.dlq):
                job = self.jobs[job_id]
                entry = job.dlq or {}
                expires = entry.get("expiresAt")
                if expires is not None and expires <= now:
                    store.remove(fx, job)
                elif cfg.get("autoRetry") and _auto_retry_due(entry, cfg, now):
                    store.revive(fx, job, now, auto=True)

    # -- commands --------------------------------------------------------------------------

    def cmd_dlq(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self.all_queues.get(str(cmd.get("queue")))
        entries = self._dlq_jobs(q, cmd.get("filter"))
        count = as_int(cmd.get("count"), len(entries))
        chosen = entries[: max(count, 0)]
        return {
            "ok": True,
            "jobs": [j.to_wire() for j in chosen],
            "entries": [{"job": j.to_wire(), **(j.dlq or {})} for j in chosen],
        }

    def _dlq_jobs(self, q: QueueState | None, flt: object) -> list[Job]:
        jobs = [self.jobs[i] for i in (q.dlq if q else ())]
        if not isinstance(flt, Mapping):
            return jobs
        reason = flt.get("reason")
        if isinstance(reason, str):
            jobs = [j for j in jobs if (j.dlq or {}).get("reason") == reason]
        offset = as_int(flt.get("offset"), 0)
        limit = as_int(flt.get("limit"), len(jobs))
        return jobs[offset : offset + limit]

    def cmd_retry_dlq(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self.all_queues.get(str(cmd.get("queue")))
        job_id = cmd.get("jobId")
        if job_id is not None:
            chosen = [job_id] if q is not None and job_id in q.dlq else []
        else:
            chosen = list(q.dlq if q else ())[: as_int(cmd.get("count"), 1 << 62)]
        for i in chosen:
            self.store.revive(fx, self.jobs[i], now)
        if chosen:
            fx.events.append(("ready", str(cmd.get("queue")), ""))
        return {"ok": True, "count": len(chosen)}

    def cmd_purge_dlq(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self.all_queues.get(str(cmd.get("queue")))
        doomed = list(q.dlq if q else ())
        for i in doomed:
            self.store.remove(fx, self.jobs[i])
        return {"ok": True, "count": len(doomed)}

    def cmd_remove_dlq_job(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self.all_queues.get(str(cmd.get("queue")))
        job_id = cmd.get("jobId")
        if q is None or not isinstance(job_id, str) or job_id not in q.dlq:
            return {"ok": True, "data": {"removed": False}}
        self.store.remove(fx, self.jobs[job_id])
        return {"ok": True, "data": {"removed": True}}

    def cmd_get_dlq_stats(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        name = str(cmd.get("queue"))
        q = self.all_queues.get(name)
        jobs = [self.jobs[i] for i in (q.dlq if q else ())]
        retries = q.dlq_config.get("maxAutoRetries", 3) if q else 3
        return {"ok": True, "data": {"stats": dlq_stats(name, jobs, int(retries), now)}}


def _auto_retry_due(entry: Mapping[str, Any], cfg: Mapping[str, Any], now: int) -> bool:
    if as_int(entry.get("retryCount"), 0) >= as_int(cfg.get("maxAutoRetries"), 3):
        return False
    return now - as_int(entry.get("enteredAt"), now) >= as_int(cfg.get("autoRetryInterval"), 0)
