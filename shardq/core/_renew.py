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

# `store.orphans` is pruned at a close only once it holds more than this many (and twice as
# many as the last prune left).
ORPHANS_PRUNE_MIN = 1024


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
        heartbeating it over another connection, and lease expiry reclaims it otherwise. It
        is noted in `store.orphans` with its lease record then (`idle_orphans`).
        """
        released = 0
        orphans = self.store.orphans
        for job_id, delivery in sorted(self.conn_jobs.pop(conn, {}).items()):
            self.job_conn.pop(job_id, None)
            job = self.jobs.get(job_id)
            if job is None or job.state != ACTIVE or job.delivery != delivery:
                continue
            lease = self.leases.get(job_id)
            if lease is not None and lease.renewals > 0:
                orphans[job_id] = lease
                continue
            self.store.move(fx, job, "requeue", now, {})
            fx.events.append(("ready", job.queue, job.id))
            released += 1
        if len(orphans) > self.store.orphans_checked_at:
            self._prune_orphans()
        return released

    def idle_orphans(self) -> int:
        """How many jobs kept active at their connection's close still have the lease they
        had then: active with no open connection holding them and not renewed since, so no
        worker shows it still has them. A graceful stop's drain does not wait for these
        (docs/runtime.md, "Graceful shutdown"): they stay active and the next start
        recovers them (docs/protocol.md §4.12)."""
        return self._prune_orphans()

    def _prune_orphans(self) -> int:
        """Forget the orphans that were acked, failed, lapsed, delivered again or renewed
        since their close, and return how many are left. Called at a close once the table
        doubled since the last prune, so it costs O(1) a close amortized."""
        orphans, leases = self.store.orphans, self.leases
        for job_id in [j for j, lease in orphans.items() if leases.get(j) is not lease]:
            del orphans[job_id]
        self.store.orphans_checked_at = max(ORPHANS_PRUNE_MIN, 2 * len(orphans))
        return len(orphans)
