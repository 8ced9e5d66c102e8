"""Fold one batch of mutations into the final state of every row it touches.

The writer receives a job's push, lease and completion in the same flush window often enough
that writing each step would triple the row writes. `coalesce` turns the batch into a `Plan`:
the final record (or deletion) of each touched job and queue, plus the queues obliterated
along the way. Writing the plan gives exactly the state that applying the mutations one by one
would give, because:

- a `put` replaces the whole record, so nothing before it matters for that job;
- an `upd` merges into the record as it stands at that point (pending in this batch, or the
  stored row, read once per batch), and is skipped if the job does not exist at that point;
- a `qdel` turns every pending record of that queue into a deletion, and deletes that queue's
  stored rows *before* the plan's records are written, so a later `put` in the batch survives;
  a stored row that nothing in the batch touched before the `qdel` keeps its stored queue, so
  an `upd` after the `qdel` finds it gone exactly when its stored queue was obliterated.

The mutation shapes are defined in `shardq.core._mutations`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardq.core._mutations import Mutation, Record
from shardq.storage._errors import StorageError

__all__ = ["Fetch", "Plan", "coalesce", "row_fields"]

Fetch = Callable[[Collection[str]], Mapping[str, Record]]
"""Reads the stored records of the given job ids (missing ids are simply absent)."""

# A parsed mutation: (kind, job id or queue name, record / changes / cfg / _NOTHING).
_Op = tuple[str, str, Record]
_NOTHING: Record = {}  # the payload of "del" and "qdel"; never read

# Fields every stored record must carry: they fill NOT NULL columns.
_REQUIRED: tuple[tuple[str, type], ...] = (("queue", str), ("state", str), ("seq", int))


@dataclass
class Plan:
    """The net effect of one batch. `None` as a value means "delete this row"."""

    jobs: dict[str, Record | None] = field(default_factory=dict)
    queues: dict[str, Record | None] = field(default_factory=dict)
    obliterated: dict[str, None] = field(default_factory=dict)
    """Queues whose stored jobs are deleted before `jobs` is written (an ordered set)."""
    skipped: int = 0
    """`upd` mutations that found no job to update."""


def coalesce(mutations: Sequence[Mutation], fetch: Fetch) -> Plan:
    """Fold `mutations` (in order) into a `Plan`; `fetch` reads stored records.

    Input records are never modified. Raises `StorageError` naming the first malformed
    mutation (unknown kind, wrong arity, wrong types, a `put` record without an id).
    """
    ops = [_parse(index, mutation) for index, mutation in enumerate(mutations)]
    folder = _Folder(fetch(_ids_first_touched_by_upd(ops)))
    for kind, key, payload in ops:
        folder.dispatch[kind](key, payload)
    return folder.plan


def row_fields(job_id: str, rec: Record) -> tuple[str, str, Any, Any, int]:
    """(queue, state, priority, run_at, seq) of a final record, checked for the NOT NULLs.

    Raises `StorageError` naming the job and the missing or mistyped field.
    """
    if not isinstance(rec, dict):
        raise StorageError(f"job {job_id!r}: record is a {type(rec).__name__}, not a map")
    for name, kind in _REQUIRED:
        value = rec.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise StorageError(
                f"job {job_id!r}: record field {name!r} must be {kind.__name__}, got {value!r}"
            )
    return rec["queue"], rec["state"], rec.get("priority"), rec.get("runAt"), rec["seq"]


def _ids_first_touched_by_upd(ops: list[_Op]) -> list[str]:
    # Only these need the stored row: any other op on a job replaces or deletes it first.
    seen: set[str] = set()
    wanted: list[str] = []
    for kind, key, _ in ops:
        if kind in _JOB_KINDS and key not in seen:
            seen.add(key)
            if kind == "upd":
                wanted.append(key)
    return wanted


class _Folder:
    def __init__(self, stored: Mapping[str, Record]) -> None:
        self.plan = Plan()
        self._stored = stored
        # Records this batch built itself (merged copies): safe to update in place. Anything
        # else came from the caller or the store's cache and is copied on its first change.
        self._owned: set[str] = set()
        self.dispatch: dict[str, Callable[[str, Record], None]] = {
            "put": self._put,
            "upd": self._upd,
            "del": self._del,
            "queue": self._queue,
            "qdel": self._qdel,
        }

    def _put(self, job_id: str, rec: Record) -> None:
        self.plan.jobs[job_id] = rec
        self._owned.discard(job_id)

    def _upd(self, job_id: str, changes: Record) -> None:
        jobs = self.plan.jobs
        if job_id in jobs:
            current = jobs[job_id]
        else:
            current = self._stored.get(job_id)
            if current is not None and current.get("queue") in self.plan.obliterated:
                current = None  # untouched until now, so its stored queue was obliterated
        if current is None:
            self.plan.skipped += 1
            return
        if job_id in self._owned:
            current.update(changes)
        else:
            current = {**current, **changes}
            self._owned.add(job_id)
        jobs[job_id] = current

    def _del(self, job_id: str, _payload: Record) -> None:
        self.plan.jobs[job_id] = None
        self._owned.discard(job_id)

    def _queue(self, name: str, cfg: Record) -> None:
        self.plan.queues[name] = cfg

    def _qdel(self, name: str, _payload: Record) -> None:
        self.plan.queues[name] = None
        self.plan.obliterated[name] = None
        jobs = self.plan.jobs
        for job_id in [
            j for j, rec in jobs.items() if rec is not None and rec.get("queue") == name
        ]:
            jobs[job_id] = None
            self._owned.discard(job_id)


_JOB_KINDS = frozenset({"put", "upd", "del"})
# kind -> the types of the fields after the kind
_SHAPES: dict[str, tuple[type, ...]] = {
    "put": (dict,),
    "upd": (str, dict),
    "del": (str,),
    "queue": (str, dict),
    "qdel": (str,),
}


def _parse(index: int, mutation: object) -> _Op:
    if not isinstance(mutation, tuple | list) or not mutation:
        raise StorageError(f"mutation #{index} is not a non-empty tuple: {mutation!r:.200}")
    kind = mutation[0]
    shape = _SHAPES.get(kind) if isinstance(kind, str) else None
    if shape is None:
        raise StorageError(f"mutation #{index} has unknown kind {kind!r:.100}")
    fields = mutation[1:]
    if len(fields) != len(shape) or not all(map(isinstance, fields, shape)):
        expected = ", ".join(t.__name__ for t in shape)
        raise StorageError(
            f"mutation #{index} ({kind}) must be ({kind!r}, {expected}): {mutation!r:.200}"
        )
    if kind == "put":
        rec = fields[0]
        job_id = rec.get("rowKey") or rec.get("id")
        if not isinstance(job_id, str):
            raise StorageError(f"mutation #{index} (put): record field 'id' must be str")
        return kind, job_id, rec
    return kind, fields[0], fields[1] if len(fields) == 2 else _NOTHING
