"""Leases kept and given back: heartbeats, lock extension, a closed connection's release.

`Consumer` (`_consume`) inherits these commands: they read and change only the leases, the
jobs' heartbeat times and the connection tables of the job store, none of the pulling or
completing paths (fencing rules: `_consume`'s docstring).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardq.errors import CommandError

from ._effects import Effects
from ._job import Job
from ._lifecycle import ACTIVE
from ._options import is_number
from ._state import JobStore
from ._tables import Lease

__all__ = ["LeaseRenewal"]


class LeaseRenewal:
    """HEARTBEAT(B), EXTENDLOCK(S) and the release of a closed connection's jobs."""

    store: JobStore
    leases: dict[str, Lease]
    conn_jobs: dict[str, dict[str, int]]
    job_conn: dict[str, str]
    jobs: dict[str, Job]

    def _renew(self, job_id: object, token: object, duration: object, now: int) -> bool:
        job = self.store.find(job_id)
        if job is None or job.state != ACTIVE:
            return False
        if token is None:
            job.last_heartbeat = now
            return True
        lease = self.leases.get(job.id)
        # A lapsed lease cannot be renewed (bunqueue): the holder may still ACK it, not extend it.
        if lease is None or token != job.token or lease.expires_at <= now:
            return False
        # A new record: the old one may be the lease of the other jobs of the same pull.
        ttl = int(duration) if is_number(duration) and duration > 0 else None
        self.leases[job.id] = lease.renewed(now, ttl)
        job.last_heartbeat = now
        return True

    def cmd_job_heartbeat(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        if not self._renew(cmd.get("id"), cmd.get("token"), cmd.get("duration"), now):
            raise CommandError("Job not found or not active (or invalid token)")
        return {"ok": True, "data": {"ok": True}}

    def cmd_job_heartbeat_b(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        ids = cmd.get("ids") if isinstance(cmd.get("ids"), list) else []
        tokens = cmd.get("tokens") if isinstance(cmd.get("tokens"), list) else []
        count = 0
        for i, job_id in enumerate(ids or ()):
            token = tokens[i] if tokens and i < len(tokens) else None
            count += self._renew(job_id, token, None, now)
        return {"ok": True, "data": {"ok": True, "count": count}}

    def cmd_extend_lock(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        job_id, token = cmd.get("id"), cmd.get("token")
        job = self.jobs.get(job_id) if isinstance(job_id, str) and job_id in self.leases else None
        if job is None or (token is not None and token != job.token):
            raise CommandError("Lock not found or invalid token")
        self._renew(job_id, job.token, cmd.get("duration"), now)
        return {"ok": True}

    def cmd_extend_locks(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        ids, tokens, durations = (cmd.get(k) or [] for k in ("ids", "tokens", "durations"))
        count = 0
        for i, job_id in enumerate(ids):
            token = tokens[i] if i < len(tokens) else None
            duration = durations[i] if i < len(durations) else None
            count += self._renew(job_id, token, duration, now)
        return {"ok": True, "count": count}

    def release_connection(self, fx: Effects, conn: str, now: int) -> int:
        """Give back a closed connection's jobs, charging no attempt (docs/protocol.md §2.6).

        A job whose lease was renewed at least once stays active: a pooled client may be
        heartbeating it over another connection, and lease expiry reclaims it otherwise.
        """
        released = 0
        for job_id, delivery in sorted(self.conn_jobs.pop(conn, {}).items()):
            self.job_conn.pop(job_id, None)
            job = self.jobs.get(job_id)
            if job is None or job.state != ACTIVE or job.delivery != delivery:
                continue
            lease = self.leases.get(job_id)
            if lease is not None and lease.renewals > 0:
                continue
            self.store.move(fx, job, "requeue", now, {})
            fx.events.append(("ready", job.queue, job.id))
            released += 1
        return released
