"""Pulling, leases and completions: PULL, PULLB, ACK, ACKB, FAIL, heartbeats, release.

Fencing rules (docs/protocol.md §6.2; bunqueue's `assertLeaseToken` applies the same):
- while a lease exists, ACK and FAIL must carry its exact token;
- every delivery gets a token, a pull without an owner too (it is not in that pull's reply,
  which keeps bunqueue's shape): an ACK or FAIL without a token still completes such a
  delivery, as in bunqueue, but one carrying another delivery's token is refused, so a
  worker whose lease lapsed cannot complete the job someone else is now running;
- a token whose TTL passed is accepted while nobody else holds the job, even after the lease
  sweep put it back in the queue;
- a token from an older delivery is rejected once the job was delivered again;
- a second ACK of the same delivery is a no-op;
- an ACK or FAIL for a delivery the timeout sweep already retired gets "already-finalized".
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from typing import Any, Final, NamedTuple

from shardq.errors import CommandError

from . import _tables
from ._compact import CompactJobs
from ._effects import Effects
from ._job import Job, backoff_delay, wire_maps
from ._lifecycle import ACTIVE, COMPLETED, DELAYED, WAITING
from ._options import as_int, check_number, is_number, validate_queue_name
from ._parts import FlowPart, GroupPart, LimiterPart
from ._produce import Producer
from ._queue import QueueState
from ._queue_limits import QueueLimits
from ._ready import unexpired
from ._renew import LeaseRenewal
from ._state import JobStore
from ._tables import (
    Lease,
    arm_timeout,
    delivery_key,
    push_leases,
    retain_completed,
    track_conn,
    trim_completed,
)

__all__ = ["Consumer"]

FINALIZED: Final = {"ok": True, "data": {"applied": False, "reason": "already-finalized"}}
_APPLY, _NOOP, _RETIRED = "apply", "noop", "retired"
# A command's field check (`Route.check`): its error, or None; None when it has none.
Check = Callable[[Mapping[str, Any]], str | None] | None


def _not_processing(job_id: object) -> CommandError:
    return CommandError(f"Job not found or not in processing state: {job_id}")


class Consumer(LeaseRenewal):
    """Pulls, leases and completions over the job store (the engine's `consume` component);
    heartbeats, lock extension and a closed connection's release come from `LeaseRenewal`."""

    def __init__(
        self,
        store: JobStore,
        limiter: LimiterPart,
        groups: GroupPart,
        flows: FlowPart,
        produce: Producer,
        *,
        compact_pulls: bool = False,
    ) -> None:
        self.store = store
        # PULLB answers `CompactJobs` instead of wire maps: for a host that packs replies
        # itself and would rather not build 44-key maps per job (the shard process).
        self.compact_pulls = compact_pulls
        self.limiter = limiter
        self.groups = groups
        self.flows = flows
        self.produce = produce
        self.config = store.config
        self.conn_jobs = store.conn_jobs
        self.dependents = store.dependents
        self.finalized = store.finalized
        self.ids = store.ids
        self.job_conn = store.job_conn
        self.jobs = store.jobs
        self.leases = store.leases
        self.queues = store.queues
        self.rng = store.rng
        self.timeouts = store.timeouts
        self.unleased = store.unleased

    # -- pulling ---------------------------------------------------------------------------

    def cmd_pull(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        queue = self._check_pull(cmd)
        owner = _owner(cmd)
        q = self.ready_queue(fx, queue, now)
        taken = self.take_many(fx, q, 1, now) if q is not None else None
        reply: dict[str, Any]
        if taken:
            job = taken[0]
            token = self.activate(fx, job, self._grant(fx, cmd, owner), now)
            reply = {"ok": True, "job": job.to_wire()}
            if owner is not None:
                reply["token"] = token
        else:
            reply = {"ok": True, "job": None}
            if owner is not None:
                reply["token"] = None
        return reply

    def cmd_pullb(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        queue = self._check_pull(cmd)
        error = check_number(cmd.get("count"), "count", 1, 1000)
        if error:
            raise CommandError(error)
        owner = _owner(cmd)
        q = self.ready_queue(fx, queue, now)
        taken = self.take_many(fx, q, as_int(cmd.get("count"), 1), now) if q is not None else []
        tokens = self.activate_all(fx, taken, self._grant(fx, cmd, owner), now) if taken else []
        reply: dict[str, Any] = {"ok": True, "jobs": self.pulled(taken)}
        if owner is not None:
            reply["tokens"] = [token or "" for token in tokens]
        return reply

    def pulled(self, jobs: list[Job]) -> list[dict[str, Any]] | CompactJobs:
        """How PULLB puts its jobs in the reply: wire maps, or `CompactJobs` snapshots."""
        return CompactJobs.of(jobs) if self.compact_pulls else wire_maps(jobs)

    def _check_pull(self, cmd: Mapping[str, Any]) -> str:
        queue = cmd.get("queue")
        error = validate_queue_name(queue) or check_number(cmd.get("timeout"), "timeout", 0, 60000)
        if error:
            raise CommandError(error)
        return str(queue)

    def ready_queue(self, fx: Effects, queue: str, now: int) -> QueueState | None:
        """The queue to pull from, with its due delayed jobs promoted; None if paused or empty."""
        q = self.queues.get(queue)
        if q is None or q.paused:
            return None
        self.promote_due(fx, now)
        return q

    def take_many(
        self,
        fx: Effects,
        q: QueueState,
        count: int,
        now: int,
        limited: bool = True,
        grouped: bool = True,
    ) -> list[Job]:
        """Up to `count` deliverable jobs of `q`, best first, off its ready heap (TTL-expired
        ones are dropped on the way), within the queue's and its groups' limits. They are
        still in the waiting state: deliver them with `activate` or `activate_all`.
        `grouped` False takes ungrouped jobs only."""
        if limited and q.limits is not None:
            return self._take_limited(fx, q, q.limits, count, now)
        if grouped and q.groups is not None:
            return self.groups.take(fx, q, count, now)
        # `take_ready`, written out: a pull's common case costs no call more.
        taken = q.pop_ready_many(count)
        for job in taken:
            if job.opts and job.opts.get("ttl"):
                return unexpired(self.store, fx, q, taken, count, now)
        return taken

    def _take_limited(
        self, fx: Effects, q: QueueState, limits: QueueLimits, count: int, now: int
    ) -> list[Job]:
        allowed = limits.cap(q.counts[ACTIVE], count, now)
        taken = self.take_many(fx, q, allowed, now, False) if allowed > 0 else []
        limits.note(len(taken), now)
        if allowed < count:
            self.limiter.held_back(q.name)
        return taken

    def _grant(self, fx: Effects, cmd: Mapping[str, Any], owner: str | None) -> _Grant:
        """What every job of one pull gets: owner, lease TTL and the connection to track."""
        ttl = _positive(cmd.get("lockTtl"), self.config.default_lock_ttl_ms)
        conn = fx.conn
        return _Grant(owner, ttl, conn, None if cmd.get("detach") else conn)

    def activate(self, fx: Effects, job: Job, grant: _Grant, now: int) -> str | None:
        """Deliver one waiting job that `take_many` returned: move it to active, lease it and
        arm its timeout. Returns its lease token (None for a pull without an owner)."""
        job.started_at = now
        job.last_heartbeat = now
        job.delivery += 1
        self.store.move(fx, job, "pull", now, {"startedAt": now, "lastHeartbeat": now})
        token = self._hold(job, grant, now)
        if token is not None:
            push_leases(self.store, now + grant.ttl, (job,))
        return token

    def activate_all(
        self, fx: Effects, jobs: list[Job], grant: _Grant, now: int
    ) -> Sequence[str | None]:
        """`activate` for distinct waiting jobs of one queue (PULLB): one lifecycle pass for
        all of them and one lease-heap entry for all their leases."""
        first = jobs[0]
        changes = {"startedAt": now, "lastHeartbeat": now}
        if grant.owner is None:
            for job in jobs:
                job.started_at = now
                job.last_heartbeat = now
                job.delivery += 1
            self.store.move_run(fx, jobs, first.state, first.queue, "pull", now, changes)
            return [self._hold(job, grant, now) for job in jobs]
        # The move reads none of the fields a delivery sets: `lease_all` sets them, and does
        # `_hold` of each job, in the same pass (the same tokens, leases, tracked connection,
        # timeouts).
        self.store.move_run(fx, jobs, first.state, first.queue, "pull", now, changes)
        tokens = self.ids.tokens(len(jobs))
        _tables.lease_all(self.store, self.leases, jobs, tokens, grant.owner, grant.conn,
                          grant.ttl, grant.track, now)  # fmt: skip
        push_leases(self.store, now + grant.ttl, jobs, tokens)
        return tokens

    def _hold(self, job: Job, grant: _Grant, now: int) -> str | None:
        """The claim on a job just moved to active: a fresh token, and a lease for a pull with
        an owner, else the stall watch; the connection to release it with; its timeout.
        The caller schedules the lease expiry (`push_leases`). Returns the token for a pull
        with an owner, None otherwise (bunqueue's reply has no token then)."""
        job.token = token = self.ids.token()
        if grant.owner is not None:
            job.leased = True
            self.leases[job.id] = Lease(grant.owner, grant.conn, now, grant.ttl)
        else:
            job.leased = False
            self.unleased[job.id] = None
        if grant.track is not None:
            track_conn(self.store, grant.track, job)
        if job.opts:
            arm_timeout(self.store, job, now)
        return token if job.leased else None

    def promote_due(self, fx: Effects, now: int) -> None:
        """Move every delayed job whose run time has come to its ready heap."""
        heap = self.store.delayed
        while heap and heap[0][0] <= now:
            key = heapq.heappop(heap)
            job = self.jobs.get(key[-1])
            if job is not None and job.dkey is key and job.state == DELAYED:
                self.store.move(fx, job, "promote", now, {})
                fx.events.append(("ready", job.queue, job.id))

    # -- fencing ---------------------------------------------------------------------------

    def fence(self, job_id: object, token: object) -> tuple[str, Job | None]:
        """Classify a completion attempt as apply, no-op or retired.

        Raises:
            CommandError: with bunqueue's lease error strings.
        """
        finalized = self.finalized
        if finalized and isinstance(token, str) and finalized.get(token) == job_id:
            return _RETIRED, None
        job = self.store.find(job_id)
        if job is None:
            raise _not_processing(job_id)
        if (
            token is None
            and job.state != ACTIVE
            and finalized
            and finalized.get(delivery_key(job)) == job.id
        ):
            return _RETIRED, None
        if job.state == ACTIVE:
            # Active and leased: it has a lease (the store's invariant), whose token is the
            # job's (`Lease`).
            if not job.leased:
                # A delivery without an owner: any token it carries must be this delivery's.
                # (An active job recovered from disk has no token yet: nothing to fence with.)
                if token and job.token is not None and token != job.token:
                    raise CommandError(f"Invalid or expired lock token for job {job.id}")
                return _APPLY, job
            if not isinstance(token, str) or not token:
                raise CommandError(f"Lock token required for job {job.id}")
            if token != job.token:
                raise CommandError(f"Invalid or expired lock token for job {job.id}")
            return _APPLY, job
        return self._fence_inactive(job, token)

    def _fence_inactive(self, job: Job, token: object) -> tuple[str, Job | None]:
        # A token-less ACK matches a delivery that was made without an owner.
        ownerless = job.delivery > 0 and not job.leased
        same_delivery = ownerless if token is None else token == job.token
        if job.state == COMPLETED and (same_delivery or token is None):
            return _NOOP, job
        if same_delivery and job.state in (WAITING, DELAYED):
            return _APPLY, job
        if job.state == COMPLETED:
            raise CommandError(f"Invalid or expired lock token for job {job.id}")
        raise _not_processing(job.id)

    # -- completion ------------------------------------------------------------------------

    def cmd_ack(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        outcome, job = self.fence(cmd.get("id"), cmd.get("token"))
        if outcome == _RETIRED:
            return dict(FINALIZED)
        if outcome == _APPLY and job is not None:
            self.complete(fx, job, cmd, "result", cmd.get("removeOnComplete"), now)
        return {"ok": True}

    def cmd_ackb(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        ids = cmd.get("ids")
        if not isinstance(ids, list):
            raise CommandError("ids must be an array")
        extras = {k: cmd.get(k) for k in ("tokens", "results", "removeOnCompletes")}
        for name, values in extras.items():
            if values is not None and (not isinstance(values, list) or len(values) != len(ids)):
                raise CommandError(f"ACKB {name} length must match ids length")
        tokens, results, removes = (extras[k] or [None] * len(ids) for k in extras)
        todo, ignored, simple = self._fence_all(ids, tokens)
        if todo:
            picks = todo.values()
            values = None if extras["results"] is None else [results[i] for i in picks]
            chosen = None if extras["removeOnCompletes"] is None else [removes[i] for i in picks]
            self.complete_all(fx, list(todo), values, chosen, now, simple)
        if ignored:
            data = {"ignoredIds": [ids[i] for i in ignored], "ignoredIndices": ignored}
            return {"ok": True, "data": data}
        return {"ok": True}

    def _fence_all(
        self, ids: list[Any], tokens: list[Any]
    ) -> tuple[dict[Job, int], list[int], bool]:
        """`fence` of each (id, token) of an ACKB, every lease checked before anything is
        applied: the jobs to complete, each once with the index of its first ACK (a repeated
        id is a second ACK of the same delivery), the indexes of retired deliveries, and
        whether every job to complete is active and leased, of the first one's queue, with
        neither options nor a result kept (`complete_all`'s `checked`).

        An active job's own lease token is the common case: it is checked here, without a
        call; anything else goes through `fence`, in order, so the same error is raised.
        An active job whose delivery was leased has a lease (the store's invariant), and the
        lease's token is the job's (`Lease`): the check reads the job alone.
        """
        todo: dict[Job, int] = {}
        ignored: list[int] = []
        jobs, finalized, fence = self.jobs, self.finalized, self.fence
        simple = True
        queue: str | None = None
        for i, (job_id, token) in enumerate(zip(ids, tokens, strict=True)):
            if type(token) is str and type(job_id) is str:
                job = jobs.get(job_id)
                if (
                    job is not None
                    and token == job.token
                    and job.leased
                    and job.state == ACTIVE
                    and not (finalized and finalized.get(token) == job_id)
                ):
                    if job not in todo:
                        todo[job] = i
                        if job.queue != queue:
                            simple = simple and queue is None
                            queue = job.queue
                        if job.opts or job.has_result:
                            simple = False
                    continue
            simple = False
            outcome, found = fence(job_id, token)
            if outcome == _APPLY:
                if found is not None and found.state != COMPLETED and found not in todo:
                    todo[found] = i
            elif outcome == _RETIRED:
                ignored.append(i)
        return todo, ignored, simple

    def _leased(self, job_id: object, token: object) -> Job | None:
        """The active job `job_id` whose lease `token` holds, when `fence` would apply it
        for its own lease's token (the common ACK); None for anything else, which `fence`
        then classifies (`_fence_all`'s check, as a call)."""
        if type(token) is not str or type(job_id) is not str:
            return None
        job = self.jobs.get(job_id)
        if job is None or token != job.token or not job.leased or job.state != ACTIVE:
            return None
        finalized = self.finalized
        if finalized and finalized.get(token) == job_id:
            return None
        return job

    def ack_run(
        self, fx: Effects, commands: Iterable[Mapping[str, Any]], check: Check, now: int
    ) -> int:
        """The ACKs `commands` starts with that each complete an active job of their own, all
        with a result or all without, in one pass (`complete_all`, ACKB's path): what
        `cmd_ack` of each in turn would do. Stops before the first other one (a schema
        error, a lease refused, a job not active or already in the run, a retired token);
        returns how many it took, each answered `{"ok": true}`, as `cmd_ack` does.

        ACKs without a result or removeOnComplete, of jobs of one queue without options or a
        kept result (bunqueue-client's Worker's, one per job), are what ACKB's `_fence_all`
        calls `simple`: they move as one run (`complete_all`'s `checked`), as ACKB's do."""
        jobs: list[Job] = []
        results: list[Any] = []
        removes: list[object] = []
        taken: set[str] = set()
        with_result: bool | None = None
        simple = True  # every remove None and every job bare, of the first one's queue
        queue: str | None = None
        fence, leased = self.fence, self._leased
        for cmd in commands:
            if cmd.get("cmd") != "ACK" or (check is not None and check(cmd) is not None):
                break
            has = "result" in cmd
            if with_result is not None and has is not with_result:
                break
            job_id, token = cmd.get("id"), cmd.get("token")
            job = leased(job_id, token)
            if job is None:
                try:
                    outcome, job = fence(job_id, token)
                except CommandError:
                    break
                if outcome != _APPLY or job is None or job.state != ACTIVE:
                    break
            if job.id in taken:
                break
            with_result = has
            taken.add(job.id)
            jobs.append(job)
            results.append(cmd.get("result"))
            remove = cmd.get("removeOnComplete")
            removes.append(remove)
            if remove is not None or job.opts or job.has_result:
                simple = False
            elif queue is None:
                queue = job.queue
            elif job.queue != queue:
                simple = False
        if not jobs:
            return 0
        if simple and not with_result:
            self.complete_all(fx, jobs, None, None, now, checked=True)
        else:
            self.complete_all(fx, jobs, results if with_result else None, removes, now)
        return len(jobs)

    def complete(
        self, fx: Effects, job: Job, source: Mapping[str, Any], key: str, remove: object, now: int
    ) -> None:
        """Complete one job, with `source[key]` as its result when present."""
        if key in source:
            changes = self._finish(job, now, True, source[key])
        else:
            changes = self._finish(job, now)
        self.store.move(fx, job, "ack", now, changes)
        self._settle(fx, job, remove, now)

    def complete_all(
        self,
        fx: Effects,
        jobs: list[Job],
        results: Sequence[Any] | None,
        removes: Sequence[object] | None,
        now: int,
        checked: bool = False,
    ) -> None:
        """`complete` for distinct jobs (ACKB), as completing them one by one would.

        `results[i]` is the result of `jobs[i]` (None: no result given); `removes[i]` its
        removeOnComplete override (None: the job's own option; `removes` None: no override
        for any of them). `checked`: the caller saw every job active, of one queue, with
        neither options nor a result kept (ACKB's `_fence_all`), so none of that is looked at
        again: the jobs move as one run.
        """
        # Then, per job, what `complete` does after the move (`_settle`). With no dependents to
        # release, nothing to remove and no result to keep, only the cache cap is left, and
        # trimming it once evicts the same jobs in the same order. Without results and
        # overrides, whether any job keeps a result or has options (which the move does not
        # change) is seen as the jobs are stamped.
        plain = results is None and removes is None
        if plain and checked:
            for job in jobs:
                job.completed_at = now
            queue = jobs[0].queue
            self.store.move_run(fx, jobs, ACTIVE, queue, "ack", now, {"completedAt": now})
        elif results is None:
            for job in jobs:
                job.completed_at = now
                if job.has_result or job.opts:
                    plain = False
            self.store.move_all(fx, jobs, "ack", now, {"completedAt": now})
        else:
            finish = self._finish
            changes = [finish(job, now, True, r) for job, r in zip(jobs, results, strict=True)]
            self.store.move_all(fx, jobs, "ack", now, changes)
        if not self.dependents and (plain or _settled(jobs, removes)):
            trim_completed(self.store, fx)
            return
        overrides: Iterable[object] = repeat(None, len(jobs)) if removes is None else removes
        # The jobs after this one completed early: each eviction below leaves room for them,
        # so the same jobs are evicted at the same point as one completion at a time would.
        pending = len(jobs)
        for job, remove in zip(jobs, overrides, strict=True):
            pending -= 1
            self._settle(fx, job, remove, now, pending)

    @staticmethod
    def _finish(job: Job, now: int, has_result: bool = False, result: Any = None) -> dict[str, Any]:
        """Stamp a job's completion (and its result); returns the changes to emit."""
        job.completed_at = now
        if not has_result:
            return {"completedAt": now}
        job.result, job.has_result = result, True
        return {"completedAt": now, "returnvalue": result, "hasResult": True}

    def _settle(self, fx: Effects, job: Job, remove: object, now: int, pending: int = 0) -> None:
        """After a job completed: release its dependents, then remove it (removeOnComplete,
        or the job's own option when `remove` is None) or keep it in the bounded cache."""
        if self.dependents:
            self.store.release_dependents(fx, job.id, now)
        if job.opts:
            if "repeat" in job.opts:
                self.produce.push_successor(fx, job, now)
            if "parentId" in job.opts:
                self.flows.child_finished(fx, job, "completed", now)
        if remove is None and job.opts:
            remove = job.opts.get("removeOnComplete")
        if remove:
            self.store.remove(fx, job)
        else:
            retain_completed(self.store, fx, job, pending)

    def cmd_fail(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        outcome, job = self.fence(cmd.get("id"), cmd.get("token"))
        if outcome == _RETIRED:
            return dict(FINALIZED)
        if outcome == _NOOP or job is None or job.state != ACTIVE:
            # A lapsed delivery was already charged by the lease sweep.
            return {"ok": True}
        error = cmd.get("error")
        job.failed_reason = error if isinstance(error, str) else None
        job.stacktrace = self._stack(job, cmd.get("stack"))
        unrecoverable = bool(cmd.get("unrecoverable"))
        self.charge(fx, job, now, "max_attempts_exceeded", unrecoverable, cmd.get("removeOnFail"))
        return {"ok": True}

    def charge(
        self,
        fx: Effects,
        job: Job,
        now: int,
        exhausted: str,
        unrecoverable: bool = False,
        remove_on_fail: object = None,
    ) -> None:
        """Count one used attempt, then retry with backoff or dead-letter the job.

        `exhausted` is the DLQ reason when the attempts run out; an unrecoverable failure
        goes to the DLQ at once as "explicit_fail".
        """
        job.attempts += 1
        changes: dict[str, Any] = {
            "attempts": job.attempts,
            "failedReason": job.failed_reason,
            "stacktrace": job.stacktrace,
        }
        if unrecoverable:
            self.store.dead(fx, job, "explicit_fail", now, changes, remove_on_fail)
        elif job.attempts >= job.max_attempts:
            self.store.dead(fx, job, exhausted, now, changes, remove_on_fail)
        else:
            job.run_at = now + backoff_delay(job, self.rng)
            self.store.requeue_or_delay(fx, job, "requeue", now, changes)

    def _stack(self, job: Job, stack: object) -> list[str] | None:
        if not isinstance(stack, list):
            return job.stacktrace
        lines = [s.strip() for s in stack[: self.config.max_stack_lines] if isinstance(s, str)]
        return lines[: as_int(job.opts.get("stackTraceLimit"), 10)]


class _Grant(NamedTuple):
    owner: str | None
    ttl: int
    conn: str | None
    track: str | None  # the connection that releases the job on close (None when detached)


def _owner(cmd: Mapping[str, Any]) -> str | None:
    owner = cmd.get("owner")
    return owner if isinstance(owner, str) and owner else None


def _positive(value: object, default: int) -> int:
    if is_number(value) and value > 0:
        return int(value)
    return default


def _settled(jobs: list[Job], removes: Sequence[object] | None) -> bool:
    """Whether completing `jobs` (with `removes[i]` the removeOnComplete override of
    `jobs[i]`, None: the job's own option) leaves nothing to settle per job: no result kept,
    nothing removed."""
    overrides: Iterable[object] = repeat(None, len(jobs)) if removes is None else removes
    for job, remove in zip(jobs, overrides, strict=True):
        if job.has_result or remove or (remove is None and job.opts):
            return False
    return True
