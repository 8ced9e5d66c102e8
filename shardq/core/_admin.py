"""Queue control and the stall and DLQ settings (docs/protocol.md §9 and §10); the DLQ's own
commands and upkeep are the `dead_letters` component (`_dlq.py`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from shardq.errors import CommandError

from ._effects import Effects
from ._job import Job
from ._lifecycle import COMPLETED, DELAYED, FAILED, WAITING, WAITING_CHILDREN
from ._options import as_int, is_number
from ._queue import QueueState
from ._state import JobStore
from ._validate import MAX_COUNT, MAX_DURATION_MS

__all__ = ["QueueAdmin"]

_STALL_KEYS: Final = {"enabled": bool, "stallInterval": int, "maxStalls": int, "gracePeriod": int}
_DLQ_KEYS: Final = {
    "autoRetry": bool,
    "autoRetryInterval": int,
    "maxAutoRetries": int,
    "maxAge": int,
    "maxEntries": int,
}
# Upper bounds of the numeric config keys: times are added to `now` (DLQ `expiresAt`, stall
# deadlines), so they get the duration bound; the rest are counts.
_CONFIG_MAX: Final = {
    "stallInterval": MAX_DURATION_MS,
    "gracePeriod": MAX_DURATION_MS,
    "autoRetryInterval": MAX_DURATION_MS,
    "maxAge": MAX_DURATION_MS,
}
_CLEAN_STATES: Final = {
    None: (WAITING, DELAYED),
    "wait": (WAITING,),
    "waiting": (WAITING,),
    "prioritized": (WAITING,),
    "delayed": (DELAYED,),
    "completed": (COMPLETED,),
    "failed": (FAILED,),
    "waiting-children": (WAITING_CHILDREN,),
}


class QueueAdmin:
    """Queue control and the stall and DLQ settings (the engine's `admin` component)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.jobs = store.jobs
        self.queues = store.queues

    def _q(self, cmd: Mapping[str, Any]) -> QueueState:
        return self.store.queue(str(cmd.get("queue", "")))

    def _peek(self, cmd: Mapping[str, Any]) -> QueueState:
        """The queue for a read: a missing queue reads as defaults and is not created."""
        name = str(cmd.get("queue", ""))
        return self.queues.get(name) or QueueState(name, self.jobs)

    def _save_config(self, fx: Effects, q: QueueState) -> None:
        fx.mutations.append(("queue", q.name, q.config()))

    def _jobs_in(self, q: QueueState, states: Iterable[str]) -> list[Job]:
        wanted = set(states)
        return [j for i in q.ids if (j := self.jobs[i]).state in wanted]

    # -- pause, drain, clean, obliterate --------------------------------------------------

    def cmd_pause(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self._q(cmd)
        q.paused = True
        self._save_config(fx, q)
        return {"ok": True}

    def cmd_resume(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self._q(cmd)
        q.paused = False
        self._save_config(fx, q)
        fx.events.append(("ready", q.name, ""))
        return {"ok": True}

    def cmd_is_paused(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self.queues.get(str(cmd.get("queue")))
        return {"ok": True, "paused": bool(q and q.paused)}

    def cmd_drain(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self._q(cmd)
        doomed = self._jobs_in(q, (WAITING, DELAYED))
        for job in doomed:
            self.store.move(fx, job, "remove", now, {})
        return {"ok": True, "count": len(doomed)}

    def cmd_clean(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self._q(cmd)
        state = cmd.get("state")
        states = _CLEAN_STATES.get(state, ()) if state is None or isinstance(state, str) else ()
        grace = as_int(cmd.get("grace"), 0)
        limit = as_int(cmd.get("limit"), 1000)
        ids: list[str] = []
        for job in self._jobs_in(q, states):
            if len(ids) >= limit:
                break
            if now - _finished_at(job) >= grace:
                ids.append(job.id)
                self.store.move(fx, job, "remove", now, {})
        return {"ok": True, "count": len(ids), "ids": ids}

    def cmd_obliterate(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        name = str(cmd.get("queue", ""))
        q = self.queues.get(name)
        if q is not None:
            # The writer deletes the whole queue from one "qdel"; no per-job mutation is needed.
            for job_id in list(q.ids):
                self.store.remove(fx, self.jobs[job_id], emit=False)
            del self.queues[name]
        fx.mutations.append(("qdel", name))
        return {"ok": True}

    def cmd_list_queues(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        names = sorted(name for name, q in self.queues.items() if not q.is_default())
        return {"ok": True, "queues": names}

    # -- stall and DLQ config --------------------------------------------------------------

    def cmd_set_stall_config(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self._q(cmd)
        q.stall.update(_typed_config(cmd.get("config"), _STALL_KEYS))
        self._save_config(fx, q)
        return {"ok": True}

    def cmd_get_stall_config(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        return {"ok": True, "config": dict(self._peek(cmd).stall)}

    def cmd_set_dlq_config(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self._q(cmd)
        q.dlq_config.update(_typed_config(cmd.get("config"), _DLQ_KEYS))
        self._save_config(fx, q)
        self.store.cap_dlq(fx, q)
        return {"ok": True}

    def cmd_get_dlq_config(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        return {"ok": True, "config": dict(self._peek(cmd).dlq_config)}

    def cmd_retry_completed(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        q = self._q(cmd)
        job_id = cmd.get("id")
        if job_id is not None:
            job = self.store.find(job_id)
            chosen = [job] if job is not None and job.state == COMPLETED else []
        else:
            chosen = self._jobs_in(q, (COMPLETED,))[: as_int(cmd.get("count"), 1 << 62)]
        for job in chosen:
            self.store.revive(fx, job, now)
        return {"ok": True, "count": len(chosen)}


def _finished_at(job: Job) -> int:
    if job.state == COMPLETED and job.completed_at is not None:
        return job.completed_at
    if job.state == FAILED and job.dlq:
        return as_int(job.dlq.get("enteredAt"), job.created_at)
    return job.created_at


def _typed_config(raw: object, schema: Mapping[str, type]) -> dict[str, Any]:
    """Known keys of a config map, coerced to their types.

    Raises:
        CommandError: the config is not a map, or a value has the wrong type.
    """
    if not isinstance(raw, Mapping):
        raise CommandError("config must be an object")
    out: dict[str, Any] = {}
    for key, kind in schema.items():
        if key not in raw:
            continue
        value = raw[key]
        if kind is bool and isinstance(value, bool):
            out[key] = value
        elif key == "maxAge" and value is None:
            out[key] = None  # bunqueue: a null maxAge keeps entries forever
        elif kind is int and is_number(value) and value >= 0:
            out[key] = _bounded(key, value)
        else:
            raise CommandError(f"config.{key} must be a {'boolean' if kind is bool else 'number'}")
    return out


def _bounded(key: str, value: float) -> int:
    """A numeric config value, refused past its bound (infinity included), never clamped."""
    limit = _CONFIG_MAX.get(key, MAX_COUNT)
    if not value <= limit:
        raise CommandError(f"config.{key} must be at most {limit}")
    return int(value)
