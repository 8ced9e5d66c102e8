"""Deduplication-key administration, queue-scoped Metrics and the DLQ statistics
(docs/protocol.md §21).

Each answers in bunqueue's shape, wrapped in `data`. The dedup commands act on the engine's
`uniqueKey` claims (`unique`): removing a claim also clears the key from its job's record, so
the claim does not come back when the shard restarts and rebuilds its claims from the jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from shardq.errors import CommandError

from ._effects import Effects
from ._finished import metrics_reply
from ._job import NO_OPTIONS, Job
from ._state import JobStore
from ._validate import _queue

__all__ = ["Introspection", "dlq_stats"]

# bunqueue's FailureReason values, each counted (0 when absent) in GetDlqStats' `byReason`.
DLQ_REASONS: Final = (
    "explicit_fail",
    "max_attempts_exceeded",
    "timeout",
    "stalled",
    "ttl_expired",
    "worker_lost",
    "unknown",
)
_MAX_SAFE: Final = 2**53 - 1


def dlq_stats(queue: str, jobs: list[Job], max_auto_retries: int, now: int) -> dict[str, Any]:
    """bunqueue's DlqStats for one queue's DLQ entries."""
    by_reason = dict.fromkeys(DLQ_REASONS, 0)
    pending = expired = 0
    entered: list[int] = []
    for job in jobs:
        entry = job.dlq or {}
        reason = entry.get("reason")
        key = reason if reason in by_reason else "unknown"
        by_reason[key] += 1
        retry_at = entry.get("nextRetryAt")
        if retry_at and retry_at <= now and (entry.get("retryCount") or 0) < max_auto_retries:
            pending += 1
        expires = entry.get("expiresAt")
        if expires and expires <= now:
            expired += 1
        if isinstance(entry.get("enteredAt"), int):
            entered.append(entry["enteredAt"])
    return {
        "total": len(jobs),
        "byReason": by_reason,
        "byQueue": {queue: len(jobs)},
        "pendingRetry": pending,
        "expired": expired,
        "oldestEntry": min(entered) if entered else None,
        "newestEntry": max(entered) if entered else None,
    }


def _index(value: object, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise CommandError(f"{name} must be a non-negative safe integer")
    if not 0 <= value <= _MAX_SAFE and not (name == "end" and value == -1):
        raise CommandError(f"{name} must be a non-negative safe integer")
    return int(value)


class Introspection:
    """The dedup-key commands and queue-scoped Metrics (the engine's `introspect` component)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.config = store.config
        self.jobs = store.jobs
        self.queues = store.queues
        self.unique = store.unique

    def cmd_get_deduplication_job_id(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        owner = self.unique.get((str(cmd.get("queue")), str(cmd.get("deduplicationId"))))
        return {"ok": True, "data": {"jobId": owner}}

    def cmd_remove_deduplication_key(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        key = (str(cmd.get("queue")), str(cmd.get("deduplicationId")))
        owner = self.unique.get(key)
        if owner is None:
            return {"ok": True, "data": {"count": 0}}
        del self.unique[key]
        job = self.store.find(owner)
        if job is not None:
            self._forget_key(fx, job)
        return {"ok": True, "data": {"count": 1}}

    def cmd_remove_job_deduplication_key(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        job = self.store.find(cmd.get("id"))
        key = job.unique_key if job is not None else None
        if job is None or key is None or self.unique.get((job.queue, key)) != job.id:
            return {"ok": True, "data": {"removed": False}}
        del self.unique[(job.queue, key)]
        self._forget_key(fx, job)
        return {"ok": True, "data": {"removed": True}}

    def _forget_key(self, fx: Effects, job: Job) -> None:
        """The job no longer claims its key, in memory and in its stored record."""
        opts = {k: v for k, v in job.opts.items() if k != "uniqueKey"}
        job.opts = opts or NO_OPTIONS
        job.dedup_until = None
        fx.mutations.append(("upd", job.key, {"uniqueKey": None, "dedupUntil": None}))

    def cmd_queue_metrics(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        """Queue-scoped `Metrics` (the legacy form without `queue` is the front end's)."""
        queue = cmd.get("queue")
        if not isinstance(queue, str):
            raise CommandError("Metrics queue is required")
        error = _queue(queue, "queue")
        if error:
            raise CommandError(error)
        kind = cmd.get("type")
        if kind not in ("completed", "failed"):
            raise CommandError("Metrics type must be 'completed' or 'failed'")
        start = _index(cmd.get("start"), "start", 0)
        end = _index(cmd.get("end"), "end", -1)
        q = self.queues.get(queue)
        log = q.finished if q is not None else None
        return metrics_reply(log, kind, start, end, self.config.max_metric_minutes)
