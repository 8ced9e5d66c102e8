"""Read-only commands (docs/protocol.md §7). None of them emits a mutation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardq.errors import CommandError

from ._effects import Effects
from ._history import MINUTE_MS, TIME_BOUNDS_MS
from ._job import Job
from ._lifecycle import ACTIVE, COMPLETED, DELAYED, STATES, WAITING
from ._options import as_int
from ._state import JobStore

__all__ = ["Queries", "job_view"]


def job_view(job: Job) -> dict[str, Any]:
    """The Job map GetJob and GetJobs answer: the wire job plus state, result and reason."""
    view = job.to_wire()
    view["state"] = job.public_state()
    view["returnvalue"] = job.result if job.has_result else None
    view["failedReason"] = job.failed_reason
    if job.state == COMPLETED:
        # bunqueue reports a finished job as 100% done, whatever its handler last reported.
        view["progress"] = 100
    return view


class Queries:
    """The read-only commands over the job store (the engine's `query` component)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.config = store.config
        self.jobs = store.jobs
        self.queues = store.queues

    def cmd_get_job(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.find(cmd.get("id"))
        if job is None:
            raise CommandError("Job not found")
        return {"ok": True, "job": job_view(job)}

    def cmd_get_job_by_custom_id(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        job = self.store.find(cmd.get("customId"))
        if job is None or job.custom_id is None:
            raise CommandError("Job not found")
        return {"ok": True, "job": job_view(job)}

    def cmd_get_state(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.find(cmd.get("id"))
        return {"ok": True, "id": cmd.get("id"), "state": job.public_state() if job else "unknown"}

    def cmd_get_result(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.find(cmd.get("id"))
        reply: dict[str, Any] = {"ok": True, "id": cmd.get("id")}
        if job is not None and job.has_result:
            reply["result"] = job.result
        return reply

    def cmd_get_progress(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.find(cmd.get("id"))
        if job is None:
            raise CommandError("Job not found")
        if job.state != ACTIVE:
            raise CommandError(f"Job is not active (current state: {job.public_state()})")
        return {"ok": True, "progress": job.progress, "message": job.progress_message}

    def cmd_get_job_counts(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self.queues.get(str(cmd.get("queue")))
        counts = dict.fromkeys((*STATES, "prioritized", "paused"), 0)
        if q is not None:
            counts.update(q.counts)
            counts["prioritized"] = q.prioritized
            counts[WAITING] -= q.prioritized
            if q.paused:
                # bunqueue #92: a paused queue reports its waiting work under "paused".
                counts["paused"] = counts[WAITING] + counts["prioritized"]
                counts[WAITING] = counts["prioritized"] = 0
        reply: dict[str, Any] = {"ok": True, "counts": counts}
        if cmd.get("totals") is True:  # shardq's own (the HTTP port's rates): bunqueue's stays
            pushed, completed = (q.pushed, q.completed) if q else (0, 0)
            reply["totals"] = {"pushed": pushed, "completed": completed}
        minutes = cmd.get("history")
        if isinstance(minutes, int) and not isinstance(minutes, bool) and minutes > 0:
            # shardq's own too: the dashboard's charts (`_history`), at most the kept minutes.
            kept = min(minutes, self.config.max_history_minutes)
            rows = q.history.read(now, kept) if q is not None and q.history is not None else []
            reply["history"] = {"minuteMs": MINUTE_MS, "bounds": list(TIME_BOUNDS_MS),
                                "minutes": rows}  # fmt: skip
        return reply

    def cmd_count(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self.queues.get(str(cmd.get("queue")))
        count = q.counts[WAITING] + q.counts[DELAYED] if q else 0
        return {"ok": True, "count": count}

    def cmd_get_counts_per_priority(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        name = str(cmd.get("queue"))
        q = self.queues.get(name)
        counts: dict[str, int] = {}
        for job_id in q.ids if q else ():
            job = self.jobs[job_id]
            if job.state in (WAITING, DELAYED):
                key = str(job.priority)
                counts[key] = counts.get(key, 0) + 1
        return {"ok": True, "queue": name, "counts": counts}

    def cmd_get_jobs(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self.queues.get(str(cmd.get("queue")))
        wanted = _wanted_states(cmd.get("state"))
        jobs = [self.jobs[i] for i in (q.ids if q else ())]
        if wanted is not None:
            jobs = [j for j in jobs if j.public_state() in wanted]
        name = cmd.get("name")
        if isinstance(name, str) and name:  # shardq's own: the dashboard's search by name
            jobs = [j for j in jobs if name in j.name]
        jobs.sort(key=lambda j: (j.created_at, j.seq), reverse=cmd.get("asc") is False)
        offset = max(as_int(cmd.get("offset"), 0), 0)
        limit = max(as_int(cmd.get("limit"), 100), 0)
        return {"ok": True, "jobs": [job_view(j) for j in jobs[offset : offset + limit]]}

    def cmd_get_logs(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.find(cmd.get("id"))
        logs = list(job.logs or ()) if job else []
        start = as_int(cmd.get("start"), 0)
        end = as_int(cmd.get("end"), len(logs) - 1)
        chosen = logs[start : end + 1] if end >= 0 else logs[start:]
        return {"ok": True, "data": {"logs": chosen, "count": len(logs)}}

    def active_count(self) -> int:
        return sum(q.counts[ACTIVE] for q in self.queues.values())


def _wanted_states(state: object) -> set[str] | None:
    """States a GetJobs filter names; "prioritized" is its own state there, as in BullMQ."""
    if state is None:
        return None
    names = [state] if isinstance(state, str) else state if isinstance(state, list) else []
    return {WAITING if s == "wait" else str(s) for s in names}
