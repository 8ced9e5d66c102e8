"""Job mutation, progress and logs (docs/protocol.md §8 and §7.4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardq.errors import CommandError

from ._effects import Effects
from ._job import Job
from ._lifecycle import ACTIVE, COMPLETED, DELAYED, FAILED, QUEUED_STATES, WAITING
from ._options import as_int, check_number, is_number
from ._state import JobStore

__all__ = ["JobControl"]

_WAITING_LIKE = (WAITING, DELAYED)


class JobControl:
    """Job mutation, progress and logs (the engine's `control` component)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.config = store.config
        self.jobs = store.jobs
        self.queues = store.queues

    # -- job mutation ----------------------------------------------------------------------

    def cmd_cancel(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found or cannot be cancelled")
        if job.state == ACTIVE and cmd.get("active") is True:
            self._cancel_active(fx, job, cmd.get("reason"), now)
            return {"ok": True}
        if job.state not in QUEUED_STATES:
            raise CommandError("Job not found or cannot be cancelled")
        self.store.move(fx, job, "remove", now, {})
        return {"ok": True}

    def _cancel_active(self, fx: Effects, job: Job, reason: object, now: int) -> None:
        """shardq's `Cancel {active: true}`: a running job is dead-lettered at once (reason
        `cancelled`, no retry) and the connection that holds it is told, so its worker can
        stop the handler. The worker's late ACK or FAIL then finds no lease."""
        # Unbounded here as FAIL's error is: the frame size limit bounds both.
        text = reason if isinstance(reason, str) and reason else None
        job.failed_reason = f"cancelled: {text}" if text else "cancelled"
        lease = self.store.leases.get(job.id)
        conn = lease.conn if lease is not None else self.store.job_conn.get(job.id)
        self.store.dead(fx, job, "cancelled", now, {"failedReason": job.failed_reason}, False)
        if conn is not None:
            notice = {
                "conn": conn,
                "jobId": job.id,
                "queue": job.queue,
                "reason": job.failed_reason,
            }
            if fx.cancels is None:
                fx.cancels = [notice]
            else:
                fx.cancels.append(notice)

    def cmd_discard(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found")
        if job.state in (COMPLETED, FAILED):
            raise CommandError("Job not found")
        self._check_token(job, cmd.get("token"))
        job.failed_reason = job.failed_reason or "discarded"
        self.store.dead(fx, job, "explicit_fail", now, {"failedReason": job.failed_reason}, False)
        return {"ok": True}

    def cmd_promote(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found or not delayed")
        if job.state != DELAYED:
            raise CommandError("Job not found or not delayed")
        self._promote(fx, job, now)
        return {"ok": True}

    def _promote(self, fx: Effects, job: Job, now: int) -> None:
        job.run_at = now
        self.store.move(fx, job, "promote", now, {"runAt": now})
        fx.events.append(("ready", job.queue, job.id))

    def cmd_promote_jobs(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self.queues.get(str(cmd.get("queue")))
        limit = as_int(cmd.get("count"), 1000)
        due = [self.jobs[i] for i in (q.ids if q else ()) if self.jobs[i].state == DELAYED]
        due.sort(key=lambda j: (j.run_at, j.seq))
        for job in due[:limit]:
            self._promote(fx, job, now)
        return {"ok": True, "count": min(len(due), limit)}

    def cmd_move_to_wait(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found")
        if job.state == ACTIVE:
            self._check_token(job, cmd.get("token"))
            self.store.move(fx, job, "requeue", now, {})
        elif job.state == DELAYED:
            self._promote(fx, job, now)
        elif job.state == FAILED:
            self.store.revive(fx, job, now)
        elif job.state != WAITING:
            raise CommandError(f"Cannot move job from state '{job.public_state()}' to waiting")
        return {"ok": True}

    def cmd_move_to_delayed(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found")
        error = check_number(cmd.get("delay"), "delay", 0, 365 * 86_400_000)
        if error:
            raise CommandError(error)
        if job.state == WAITING:
            # bunqueue 2.9.5 refuses this; 2.8 delayed the job, and bunqueue-client 0.1.5's
            # move_to_delayed relies on it (docs/protocol.md §21.4).
            return self.cmd_change_delay(fx, cmd, now)
        if job.state != ACTIVE:
            raise CommandError(f"Job is not active (current state: {job.public_state()})")
        self._check_token(job, cmd.get("token"))
        job.run_at = now + as_int(cmd.get("delay"), 0)
        self.store.requeue_or_delay(fx, job, "requeue", now, {})
        return {"ok": True}

    def cmd_change_priority(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found or not in queue")
        priority = cmd.get("priority")
        if job.state not in QUEUED_STATES or not is_number(priority):
            raise CommandError("Job not found or not in queue")
        changes: dict[str, Any] = {"priority": priority}
        if isinstance(cmd.get("lifo"), bool):
            changes["lifo"] = cmd["lifo"]
        self.store.reorder(fx, job, changes)
        return {"ok": True}

    def cmd_change_delay(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found or cannot change delay")
        delay = cmd.get("delay")
        if job.state not in _WAITING_LIKE or check_number(delay, "delay", 0, 365 * 86_400_000):
            raise CommandError("Job not found or cannot change delay")
        run_at = now + as_int(delay, 0)
        if run_at > now:
            job.run_at = run_at
            self.store.move(fx, job, "delay", now, {"runAt": run_at})
        elif job.state == DELAYED:
            job.run_at = run_at
            self.store.move(fx, job, "promote", now, {"runAt": run_at})
        else:
            self.store.reorder(fx, job, {"runAt": run_at})
        return {"ok": True}

    def cmd_update(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found or cannot be updated")
        if job.state in (COMPLETED, FAILED) or "data" not in cmd:
            raise CommandError("Job not found or cannot be updated")
        job.data = cmd["data"]
        fx.mutations.append(("upd", job.key, {"data": job.data}))
        return {"ok": True}

    def _check_token(self, job: Job, token: object) -> None:
        if job.state != ACTIVE:
            return
        lease = self.store.leases.get(job.id)
        if lease is None:
            # Unleased: no token needed, but another delivery's token is refused (`fence`).
            if token and job.token is not None and token != job.token:
                raise CommandError(f"Invalid or expired lock token for job {job.id}")
            return
        if not isinstance(token, str) or not token:
            raise CommandError(f"Lock token required for job {job.id}")
        if token != job.token:  # the lease's token (`Lease`)
            raise CommandError(f"Invalid or expired lock token for job {job.id}")

    # -- progress and logs -----------------------------------------------------------------

    def cmd_progress(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found")
        if job.state != ACTIVE:
            raise CommandError(f"Job is not active (current state: {job.public_state()})")
        progress = cmd.get("progress")
        job.progress = progress if is_number(progress) else 0
        message = cmd.get("message")
        job.progress_message = message if isinstance(message, str) else None
        job.last_heartbeat = now
        changes = {"progress": job.progress, "progressMessage": job.progress_message}
        fx.mutations.append(("upd", job.key, changes))
        return {"ok": True}

    def cmd_add_log(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found")
        level = cmd.get("level") if cmd.get("level") in ("info", "warn", "error") else "info"
        entry = {"timestamp": now, "level": level, "message": str(cmd.get("message", ""))}
        limit = as_int(job.opts.get("keepLogs"), self.config.max_logs_per_job)
        # In place, and only the new line goes to storage: a log costs O(1) per line however
        # long it is (`delta` in shardq.core._mutations).
        if job.logs is None:
            job.logs = []
        logs = job.logs
        logs.append(entry)
        if len(logs) > limit:
            del logs[: len(logs) - limit]
        job.logs_added += 1
        fx.mutations.append(("delta", job.key, {"log": [entry, limit, job.logs_added]}))
        return {"ok": True, "data": {"added": True}}

    def cmd_clear_logs(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job = self.store.find(cmd.get("id"))
        if job is not None and job.logs:
            keep = as_int(cmd.get("keepLogs"), 0)
            job.logs = job.logs[max(0, len(job.logs) - keep) :] if keep > 0 else None
            fx.mutations.append(("delta", job.key, {"logclear": [keep, job.logs_added]}))
        return {"ok": True}
