"""Job groups in the engine (`JobGroups`, the engine's `groups` component): the group commands,
grouped pulls and waking the pulls a group held back (docs/protocol.md §17). The data
structures are in `_groups`.

Group settings (pause, rate limit, concurrency cap, a `RateLimitGroup` deadline) survive a
restart: each configured group is one stored row, written as `("group", queue, gid, cfg)` and
removed as `("groupdel", queue, gid)` when its last setting goes. A settings change writes that
one group's row, never its queue's other groups, so its cost does not grow with how many
groups a queue has configured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from shardq.errors import CommandError

from ._bounds import span_error
from ._effects import Effects
from ._groups import Group, GroupTable
from ._job import Job
from ._names import GROUP_COMMANDS
from ._options import _validate_group_id, is_number, validate_queue_name
from ._queue import QueueState
from ._queue_limits import QueueLimits
from ._ready import take_ready
from ._state import JobStore

__all__ = ["GROUP_COMMANDS", "JobGroups"]


# bunqueue's clients send counts as JavaScript numbers: the largest exact integer.
_MAX_SAFE = 2**53 - 1


def _positive(cmd: Mapping[str, Any], field: str) -> int:
    value = cmd.get(field)
    if (
        not is_number(value)
        or not math.isfinite(value)
        or value != int(value)
        or not 1 <= value <= _MAX_SAFE
    ):
        raise CommandError(f"{field} must be a positive integer")
    return int(value)


def _optional_count(cmd: Mapping[str, Any], field: str) -> int | None:
    return None if cmd.get(field) is None else _positive(cmd, field)


def _data(**fields: Any) -> dict[str, Any]:
    return {"ok": True, "data": fields}


class JobGroups:
    """The engine's job-group component. Owns `blocked`, the queues where a pull skipped a
    group for want of room (the only ones to watch); each queue's `GroupTable` lives on its
    `QueueState`. Takes grouped jobs and moves expired ones through the job store."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.config = store.config
        self.queues = store.queues  # the store's own dict, never replaced
        self.blocked: set[str] = set()

    # -- addressing ------------------------------------------------------------------------

    def _group_args(self, cmd: Mapping[str, Any]) -> tuple[str, str]:
        queue, gid = cmd.get("queue"), cmd.get("groupId")
        error = validate_queue_name(queue) or _validate_group_id(gid)
        if gid is None:
            error = error or "groupId is required"
        if error:
            raise CommandError(error)
        return str(queue), str(gid)

    def _peek_group(self, cmd: Mapping[str, Any]) -> tuple[GroupTable | None, Group | None]:
        queue, gid = self._group_args(cmd)
        q = self.queues.get(queue)
        table = q.groups if q is not None else None
        return table, table.groups.get(gid) if table is not None else None

    def _group(self, cmd: Mapping[str, Any], now: int) -> tuple[QueueState, str, Group]:
        """The group a setting goes to (made if new).

        Raises:
            CommandError: a new group would pass `max_configured_groups` in its queue.
        """
        queue, gid = self._group_args(cmd)
        q = self.store.queue(queue)
        if q.groups is None:
            q.groups = GroupTable(self.store.jobs)
        table = q.groups
        if gid not in table.configured_ids:
            cap = self.config.max_configured_groups
            if table.configured_count() >= cap:
                table.prune(now)  # lapsed deadlines first; rare, at the cap only
            if table.configured_count() >= cap:
                raise CommandError(f"Too many configured groups in queue {queue} (max {cap})")
        return q, gid, table.get(gid)

    def _group_saved(self, fx: Effects, q: QueueState, gid: str) -> None:
        """Persist group `gid`'s settings as they now stand: its own row only."""
        table = q.groups
        cfg = table.sync(gid) if table is not None else None
        if table is not None:
            table.unblock(gid)  # the "ready" below wakes its parked pulls
            table.drop_if_idle(gid)
        if cfg is None:
            fx.mutations.append(("groupdel", q.name, gid))
        else:
            fx.mutations.append(("group", q.name, gid, cfg))
        fx.events.append(("ready", q.name, ""))  # a lifted limit may serve parked pulls

    # -- reads -----------------------------------------------------------------------------

    def cmd_get_group_jobs_count(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        _, group = self._peek_group(cmd)
        return _data(count=group.waiting + group.delayed if group is not None else 0)

    def cmd_get_groups_jobs_count(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        queue = cmd.get("queue")
        error = validate_queue_name(queue)
        if error:
            raise CommandError(error)
        per_group = _optional_count(cmd, "maxCount")
        q = self.queues.get(str(queue))
        table = q.groups if q is not None else None
        return _data(count=table.total_depth(per_group) if table is not None else 0)

    def cmd_get_group_active_count(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        _, group = self._peek_group(cmd)
        return _data(count=group.active if group is not None else 0)

    def cmd_get_group_rate_limit(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        _, group = self._peek_group(cmd)
        limits = group.limits if group is not None else None
        if limits is None or limits.rate is None:
            return _data(limit=None)
        return _data(limit={"max": limits.rate, "duration": limits.window})

    def cmd_get_group_rate_limit_ttl(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        _, group = self._peek_group(cmd)
        max_jobs = _optional_count(cmd, "maxJobs")
        return _data(ttl=group.ttl(now, max_jobs) if group is not None else -2)

    def cmd_get_group_concurrency(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        _, group = self._peek_group(cmd)
        limits = group.limits if group is not None else None
        return _data(concurrency=limits.concurrency if limits is not None else None)

    def cmd_is_group_paused(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        _, group = self._peek_group(cmd)
        return _data(paused=group is not None and group.paused)

    # -- settings --------------------------------------------------------------------------

    def cmd_set_group_rate_limit(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        self._group_args(cmd)
        rate, window = _positive(cmd, "max"), _positive(cmd, "duration")
        q, gid, group = self._group(cmd, now)
        limits = group.limits = group.limits or QueueLimits()
        limits.rate, limits.window = rate, window
        self._group_saved(fx, q, gid)
        return {"ok": True}

    def cmd_remove_group_rate_limit(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        _, group = self._peek_group(cmd)
        limits = group.limits if group is not None else None
        if group is None or limits is None or limits.rate is None:
            return _data(removed=0)
        limits.rate = None
        if limits.empty():
            group.limits = None
        self._group_saved(fx, self.store.queue(str(cmd["queue"])), str(cmd["groupId"]))
        return _data(removed=1)

    def cmd_set_group_concurrency(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        self._group_args(cmd)
        cap = _positive(cmd, "concurrency")
        q, gid, group = self._group(cmd, now)
        limits = group.limits = group.limits or QueueLimits()
        limits.concurrency = cap
        self._group_saved(fx, q, gid)
        return {"ok": True}

    def cmd_remove_group_concurrency(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        _, group = self._peek_group(cmd)
        limits = group.limits if group is not None else None
        if group is None or limits is None or limits.concurrency is None:
            return _data(removed=0)
        limits.concurrency = None
        if limits.empty():
            group.limits = None
        self._group_saved(fx, self.store.queue(str(cmd["queue"])), str(cmd["groupId"]))
        return _data(removed=1)

    def cmd_pause_group(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        return self._set_paused(fx, cmd, True, now)

    def cmd_resume_group(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        return self._set_paused(fx, cmd, False, now)

    def _set_paused(
        self, fx: Effects, cmd: Mapping[str, Any], paused: bool, now: int
    ) -> dict[str, Any]:
        if not paused:
            _, found = self._peek_group(cmd)
            if found is None or not found.paused:
                return _data(changed=False)
        q, gid, group = self._group(cmd, now)
        if group.paused == paused:
            return _data(changed=False)
        group.paused = paused
        if not paused and q.groups is not None:
            q.groups.resumed(gid)
        self._group_saved(fx, q, gid)
        return _data(changed=True)

    def cmd_rate_limit_group(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        self._group_args(cmd)
        duration = _positive(cmd, "duration")
        error = span_error(duration, now, "duration")
        if error:
            raise CommandError(error)
        q, gid, group = self._group(cmd, now)
        group.until = now + duration
        self._group_saved(fx, q, gid)
        return {"ok": True}

    # -- pulling ---------------------------------------------------------------------------

    def take(self, fx: Effects, q: QueueState, count: int, now: int) -> list[Job]:
        """`take_many` for a queue with job groups: its ungrouped jobs first, then its groups
        round-robin within their limits."""
        store = self.store
        taken = take_ready(store, fx, q, count, now)
        table = q.groups
        if table is None or len(taken) >= count:
            return taken
        while len(taken) < count and table.ring:
            live, expired = table.take(count - len(taken), now)
            for job in expired:
                store.move(fx, job, "expire", now, {})
            taken.extend(live)
            if not expired:
                break
        if len(taken) < count and table.blocked:
            self.blocked.add(q.name)
        return taken

    # -- waking parked pulls ---------------------------------------------------------------

    def wake(self, fx: Effects, now: int) -> None:
        """Emit "ready" for each queue with a held-back group that has room again."""
        for name in list(self.blocked):
            q = self.queues.get(name)
            table = q.groups if q is not None else None
            if q is None or table is None:
                self.blocked.discard(name)
                continue
            if table.wake(now):
                fx.events.append(("ready", name, ""))
            if not table.blocked:
                self.blocked.discard(name)

    def tick(self, fx: Effects, now: int) -> None:
        if self.blocked:
            self.wake(fx, now)

    def deadline(self) -> int | None:
        """When a held-back group next has room, or None."""
        deadline: int | None = None
        for name in self.blocked:
            q = self.queues.get(name)
            table = q.groups if q is not None else None
            at = table.next_wake() if table is not None else None
            if at is not None and (deadline is None or at < deadline):
                deadline = at
        return deadline
