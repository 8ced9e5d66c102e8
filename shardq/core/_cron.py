"""Cron and repeat-every schedules: the `Cron*` commands and the jobs they fire.

A schedule is a plain record (persisted whole as `("cron", name, rec)`, removed as
`("crondel", name, queue)`). Time stays an input: the next slot is computed from the `now`
passed in, so the engine remains pure. Rules (docs/protocol.md §15):

- a slot fires at most once: `lastRun` (the slot last handled) is persisted in the same batch
  as the job it pushed, and a slot at or before `lastRun` never fires;
- a late tick fires the due slot once and moves on to the first slot after `now`; when more
  than one slot was missed (downtime, a forward jump of the clock) `skipMissedOnRestart`
  decides whether the late slot fires at all. There is never a backlog of slots;
- a backward jump of the clock only delays the next slot: it stays where it was;
- in a time zone, the local wall-clock time of a slot never goes backward: the hour that
  repeats when the clock falls back fires each wall time once, and a slot that falls in the
  hour skipped by spring-forward resolves to croniter's next valid instant.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeGuard

from croniter import croniter

from shardq.errors import CommandError

from ._bounds import count_error, cron_step_error, span_error
from ._cronskip import WorkerPresence, too_soon
from ._effects import Effects
from ._mutations import Record
from ._options import is_number, validate_data, validate_queue_name
from ._produce import Producer
from ._slots import check_zone, next_slot
from ._state import JobStore
from ._validate import validate_job

__all__ = ["CronScheduler", "next_slot"]

# jobOptions keys a schedule passes on to the jobs it fires; others are ignored, as bunqueue does.
JOB_OPTION_KEYS: Final = (
    "maxAttempts",
    "backoff",
    "timeout",
    "delay",
    "stallTimeout",
    "removeOnComplete",
    "removeOnFail",
)
# Fields of a record that are the engine's bookkeeping, not the schedule's definition.
_WIRE_HIDDEN: Final = frozenset(
    {"data", "lastJobId", "lastFiredAt", "anchor", "createdAt", "jobOptions"}
)
NOT_FOUND: Final = "Cron job not found"


def _check_expression(expr: object) -> str:
    if not isinstance(expr, str) or len(expr.split()) not in (5, 6):
        raise CommandError(f"Invalid cron expression: {expr}")
    if not croniter.is_valid(expr, second_at_beginning=len(expr.split()) == 6):
        raise CommandError(f"Invalid cron expression: {expr}")
    return expr


def _finite(value: object) -> TypeGuard[int | float]:
    return is_number(value) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not _finite(value) or value != int(value) or value <= 0:
        raise CommandError(f"{what} must be a positive integer")
    return int(value)


def _limit(value: object) -> int | None:
    if value is None:
        return None
    if not _finite(value):
        raise CommandError("maxLimit must be a number")
    _refuse(count_error(value, "maxLimit"))
    return int(value) if value > 0 else None  # <= 0 means unlimited, as in bunqueue


def _refuse(error: str | None) -> None:
    if error is not None:
        raise CommandError(error)


def build_schedule(cmd: Mapping[str, Any], old: Record | None, now: int, max_chars: int) -> Record:
    """A validated schedule record from a `Cron` command (`old`: the one it replaces)."""
    name = cmd.get("name")
    if not isinstance(name, str) or not name or len(name) > 256:
        raise CommandError("Cron name is required (a string of 1 to 256 characters)")
    error = validate_queue_name(cmd.get("queue")) or validate_data(cmd.get("data"))
    if error:
        raise CommandError(error)
    schedule, every = cmd.get("schedule"), _positive_int(cmd.get("repeatEvery"), "repeatEvery")
    if (schedule is None) == (every is None):
        raise CommandError("Cron needs exactly one of schedule and repeatEvery")
    if schedule is not None:
        _refuse(cron_step_error(_check_expression(schedule)))
    _refuse(span_error(every, now, "repeatEvery"))
    tz = cmd.get("timezone")
    if tz is not None and not check_zone(tz):
        raise CommandError(f"Invalid timezone: {tz}")
    options = cmd.get("jobOptions")
    rec: Record = {
        "name": name,
        "queue": cmd["queue"],
        "data": cmd.get("data"),
        "jobName": cmd.get("jobName") if isinstance(cmd.get("jobName"), str) else name,
        "schedule": schedule,
        "repeatEvery": every,
        "timezone": None if tz is None else str(tz),
        "priority": cmd.get("priority") if is_number(cmd.get("priority")) else 0,
        "maxLimit": _limit(cmd.get("maxLimit")),
        "uniqueKey": cmd.get("uniqueKey") if isinstance(cmd.get("uniqueKey"), str) else None,
        "dedup": cmd.get("dedup") if isinstance(cmd.get("dedup"), dict) else None,
        "immediately": bool(cmd.get("immediately", False)),
        "skipMissedOnRestart": bool(cmd.get("skipMissedOnRestart", True)),
        "skipIfNoWorker": bool(cmd.get("skipIfNoWorker", False)),
        "preventOverlap": bool(cmd.get("preventOverlap", True)),
        "jobOptions": (
            {k: options[k] for k in JOB_OPTION_KEYS if k in options}
            if isinstance(options, Mapping)
            else None
        ),
        "createdAt": old["createdAt"] if old else now,
        "executions": old["executions"] if old else 0,
        "lastRun": old.get("lastRun") if old else None,
        "lastJobId": old.get("lastJobId") if old else None,
        "lastFiredAt": old.get("lastFiredAt") if old else None,
        "anchor": now,
    }
    error = validate_job(job_fields(rec), max_chars)
    if error:
        raise CommandError(error)
    if rec["immediately"] and old is None:
        rec["nextRun"] = now
    else:
        # Never at or before the slot last handled, even if the clock went back since.
        rec["nextRun"] = next_slot(rec, max(now, rec["lastRun"] or now))
    return rec


def job_fields(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The PUSH fields of the job a schedule fires."""
    fields: dict[str, Any] = dict(rec.get("jobOptions") or {})
    fields["data"] = rec["data"]
    fields["name"] = rec["jobName"]
    fields["priority"] = rec["priority"]
    key = rec["uniqueKey"] or (f"cron:{rec['name']}" if rec["preventOverlap"] else None)
    if key is not None:
        fields["uniqueKey"] = key
        if rec["dedup"] is not None:
            fields["dedup"] = rec["dedup"]
    return fields


def wire(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A schedule as `CronGet`/`CronList` show it."""
    return {k: v for k, v in rec.items() if k not in _WIRE_HIDDEN}


class CronScheduler:
    """The engine's cron component. Owns `schedules` (name -> record), `heap` ((nextRun, name)
    entries, stale ones skipped lazily) and `workers` (who serves which queue, for
    `skipIfNoWorker`); pushes the jobs it fires through the job store. A shard without
    schedules pays one empty-dict test per tick."""

    def __init__(self, store: JobStore, produce: Producer) -> None:
        self.store = store
        self.produce = produce
        self.config = store.config
        self.schedules: dict[str, Record] = {}
        self.heap: list[tuple[int, str]] = []
        self.workers = WorkerPresence()

    def tick(self, fx: Effects, now: int) -> None:
        if self.schedules:
            self.fire(fx, now)

    def deadline(self) -> int | None:
        """When `tick` next has a schedule to fire, or None."""
        return self.due() if self.schedules else None

    # -- commands --------------------------------------------------------------------------

    def cmd_cron(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        name = cmd.get("name")
        old = self.schedules.get(name) if isinstance(name, str) else None
        rec = build_schedule(cmd, old, now, self.config.max_key_chars)
        self._save(fx, rec)
        return {"ok": True, "cron": wire(rec)}

    def cmd_cron_get(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        name = cmd.get("name")
        rec = self.schedules.get(name) if isinstance(name, str) else None
        if rec is None:
            raise CommandError(NOT_FOUND)
        return {"ok": True, "cron": wire(rec)}

    def cmd_cron_list(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        return {"ok": True, "crons": [wire(self.schedules[n]) for n in sorted(self.schedules)]}

    def cmd_cron_delete(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        name = cmd.get("name")
        if not isinstance(name, str) or name not in self.schedules:
            raise CommandError(NOT_FOUND)
        self._drop(fx, name)
        return {"ok": True}

    # -- state -----------------------------------------------------------------------------

    def _save(self, fx: Effects, rec: Record) -> None:
        self.schedules[rec["name"]] = rec
        heap = self.heap
        heapq.heappush(heap, (rec["nextRun"], rec["name"]))
        if len(heap) > 2 * len(self.schedules) + 64:
            # Schedules redefined over and over leave stale entries far from the top, where
            # `due` never reaches them: rebuild, amortised O(1) per save.
            self.heap = [(r["nextRun"], n) for n, r in self.schedules.items()]
            heapq.heapify(self.heap)
        fx.mutations.append(("cron", rec["name"], dict(rec)))

    def _drop(self, fx: Effects, name: str) -> None:
        rec = self.schedules.pop(name)
        # With its queue: the stored row goes only if it is still this copy's (a schedule
        # moved to another shard's or node's queue is saved there before this copy goes).
        fx.mutations.append(("crondel", name, str(rec["queue"])))

    def due(self) -> int | None:
        """The next slot due, dropping heap entries of deleted or rescheduled schedules."""
        heap, crons = self.heap, self.schedules
        while heap:
            at, name = heap[0]
            rec = crons.get(name)
            if rec is not None and rec["nextRun"] == at:
                return at
            heapq.heappop(heap)
        return None

    def fire(self, fx: Effects, now: int) -> None:
        """Handle the schedules whose slot is due at `now`, each at most once per tick (a slot
        handled moves `nextRun` past `now`, so no schedule can fire a backlog), and at most
        `max_cron_fires_per_tick` of them: the others stay due, so `next_deadline` asks for
        the next tick at once, and the commands waiting in between are served first."""
        for _ in range(self.config.max_cron_fires_per_tick):
            at = self.due()
            if at is None or at > now:
                return
            _, name = heapq.heappop(self.heap)
            self._fire(fx, self.schedules[name], now)

    def _fire(self, fx: Effects, rec: Record, now: int) -> None:
        slot = int(rec["nextRun"])
        try:
            missed = next_slot(rec, slot) <= now
            floor = slot if rec["lastRun"] is None else max(slot, rec["lastRun"])
            after = next_slot({**rec, "lastRun": floor}, max(now, slot))
        except CommandError:
            self._drop(fx, rec["name"])  # no future slot (30 February, past year 9999): it is over
            return
        fresh = rec["lastRun"] is None or slot > rec["lastRun"]
        skipped = missed and rec["skipMissedOnRestart"]
        if fresh and not skipped and not self._skips(rec, slot, now):
            self._push_slot(fx, rec, slot, now)
        rec["lastRun"] = slot if fresh else rec["lastRun"]
        rec["nextRun"] = after
        limit = rec["maxLimit"]
        if limit is not None and rec["executions"] >= limit:
            self._drop(fx, rec["name"])
        else:
            self._save(fx, rec)

    def _skips(self, rec: Record, slot: int, now: int) -> bool:
        if rec.get("skipIfNoWorker") and not self.workers.served(str(rec["queue"])):
            return True
        return too_soon(rec, slot, now)

    def _push_slot(self, fx: Effects, rec: Record, slot: int, now: int) -> None:
        # The job's timestamp is the slot it stands for (even when fired late), so anyone can
        # tell which slot a job belongs to.
        fields = job_fields(rec)
        fields["timestamp"] = slot
        seq = self.store.seq
        job_id = self.produce.push_one(fx, str(rec["queue"]), fields, None, now)
        if self.store.seq != seq:  # a new job; otherwise the previous one still runs (overlap)
            rec["executions"] += 1
            rec["lastJobId"] = job_id
            rec["lastFiredAt"] = now
            fx.events.append(("cron", str(rec["queue"]), job_id))

    def load(
        self, fx: Effects, records: Iterable[Record], now: int, *, recover: bool = True
    ) -> None:
        """Take persisted schedules back. A slot missed while the server was down fires once
        at the first tick, or is skipped when `skipMissedOnRestart` says so."""
        for stored in records:
            rec = dict(stored)
            if recover and rec["nextRun"] <= now and rec["skipMissedOnRestart"]:
                rec["nextRun"] = next_slot(rec, now)
                fx.mutations.append(("cron", rec["name"], dict(rec)))
            self.schedules[rec["name"]] = rec
            heapq.heappush(self.heap, (rec["nextRun"], rec["name"]))
