"""Fold one batch of mutations into the final state of every row it touches.

The writer receives a job's push, lease and completion in the same flush window often enough
that writing each step would triple the row writes. `coalesce` turns the batch into a `Plan`:
the final row (or deletion) of each touched job and queue, plus the queues obliterated along
the way. Writing the plan gives exactly the state that applying the mutations one by one
would give, because:

- a `put` replaces the whole record, so nothing before it matters for that job;
- an `upd` merges into the record as it stands at that point (pending in this batch, or the
  stored row), and is skipped if the job does not exist at that point;
- a `qdel` turns every pending record of that queue into a deletion, and deletes that queue's
  stored rows *before* the plan's records are written, so a later `put` in the batch survives;
  a stored row that nothing in the batch touched before the `qdel` keeps its stored queue, so
  an `upd` after the `qdel` finds it gone exactly when its stored queue was obliterated.

Rows are written as a record plus a patch (see `shardq.storage._store`), so the plan never
merges records: a job put in the batch becomes a `Row` with the put's record and the changes
that follow it; a stored job the batch only updates becomes a `Row` with no record, the
column fields its changes set and the changes to append to its stored patch. Both the engine's
shapes (`shardq.core._mutations`) and the encoded ones (`shardq.storage._encode`) are taken,
mixed freely; values are checked and encoded only for the rows finally written, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from shardq.core._mutations import Mutation, Record
from shardq.storage._cold import COLD_COLUMN, REFILL
from shardq.storage._deltas import wrap
from shardq.storage._encode import COLUMN_FIELDS
from shardq.storage._errors import StorageRejected
from shardq.storage._parse import Op as _Op
from shardq.storage._parse import parse_all
from shardq.storage._rows import SHARED_MIN
from shardq.storage._runs import Run

__all__ = [
    "DrainInBatch",
    "Fetch",
    "Part",
    "Plan",
    "Row",
    "Stored",
    "check_columns",
    "check_values",
    "coalesce",
    "expand_runs",
    "remember",
]


class DrainInBatch(Exception):
    """`coalesce` met a `qdrain`: one plan cannot say where among the rows it deletes, so
    the caller applies the batch in steps around each (`shardq.storage._drain.steps`)."""


Stored = tuple[str, int, int, int]
"""What the writer knows of a stored row: (queue, length of rec, length of patch, bytes of
its `delta` ops in the `job_deltas` table)."""

Fetch = Callable[[Collection[str]], Mapping[str, Stored]]
"""Reads what is known of the stored rows of the given job ids (missing ids are absent)."""

Part = bytes | Record
"""A record or change map: encoded already, or still the engine's dict."""

# The `changed` of every put's row: a put's columns are in its `values`, so nothing adds to
# it (a row made whole from a stored one gets a new map, `_write.absorb_survivor`).
_NO_CHANGES: dict[str, Any] = {}
# A dict lookup's "no such key", where None means "deleted".
_ABSENT: Any = object()
# Fields every stored record must carry: they fill NOT NULL columns.
_REQUIRED: tuple[tuple[str, type], ...] = (("queue", str), ("state", str), ("seq", int))
_REQUIRED_TYPES = dict(_REQUIRED)
_INDEX = {name: i for i, name in enumerate(COLUMN_FIELDS)}
_REQUIRED_AT = tuple((_INDEX[name], kind) for name, kind in _REQUIRED)
_CHECKED_AT = ((0, str), (1, str), (4, int))  # the positions `check_values` tests inline
if _REQUIRED_AT != _CHECKED_AT:
    raise AssertionError(f"the required column fields moved: {_REQUIRED_AT}")


class Row:
    """The net write of one job.

    `values` set: the job was put in this batch; write `rec` and `patch` as its whole row, with
    `values` (the column fields, in `COLUMN_FIELDS` order) as its columns; a cold row's go on
    with its `lifo`, `gid`, `ukey` and `made` (or `REFILL` alone: set them from the merged
    record).
    `values` None: a stored job this batch updates; set the column fields in `changed` and
    append `patch` to its stored patch. `stored` is what was known of it before the batch.
    `kept`: patch entries already stored, written back before `patch` (see `_write`).
    `deltas`: `delta` ops to append to a stored job's `job_deltas` rows (a job put in this
    batch takes its ops into `patch` instead: its whole row is written anyway).

    Two or three rows are made per job a batch touches, so a row allocates only what its kind
    uses: a put's `changed` and every row's `patch` and `deltas` start as one shared empty
    container, which nothing writes to (`changed` is only set on a stored job's row; `patch`
    and `deltas` are replaced by a list of their own at their first entry, `_Folder.fold`
    and `_Folder._delta`: most puts are written before any change follows them).
    """

    __slots__ = ("changed", "deltas", "kept", "patch", "rec", "stored", "values")

    def __init__(self, values: list[Any] | None, rec: Part | None, stored: Stored | None) -> None:
        self.values = values
        self.rec = rec
        self.stored = stored
        self.patch: Sequence[Part] = ()
        self.changed: dict[str, Any] = _NO_CHANGES if stored is None else {}
        self.kept = b""
        self.deltas: Sequence[Part] = ()

    @property
    def queue(self) -> Any:
        """The job's queue as it stands."""
        if self.values is not None:
            return self.values[0]
        assert self.stored is not None
        return self.changed.get("queue", self.stored[0])

    @classmethod
    def of_run(cls, run: Run, stored: Stored) -> Row:
        """The row of a stored job that `run`'s changes alone touched so far (`_runs`)."""
        row = cls(None, None, stored)
        row.patch = list(run.patch)
        row.changed = dict(run.changed)
        return row


@dataclass
class Plan:
    """The net effect of one batch. `None` as a value means "delete this row"."""

    jobs: dict[str, Row | None] = field(default_factory=dict)
    queues: dict[str, Record | None] = field(default_factory=dict)
    crons: dict[str, Record | None] = field(default_factory=dict)
    """Cron schedule records by name (None: delete the schedule, whatever its queue)."""
    cron_drops: dict[tuple[str, str], None] = field(default_factory=dict)
    """(name, queue) of schedules deleted only if the stored one is still on that queue,
    deleted before `crons` is written: a copy left on another shard or node, cleaned up
    after the schedule moved, never deletes the moved schedule's row (an ordered set)."""
    webhooks: dict[str, Record | None] = field(default_factory=dict)
    """Webhook records by id (None: delete the webhook)."""
    flows: dict[str, Record | None] = field(default_factory=dict)
    """Flow outbox notices by key (None: the parent acknowledged it)."""
    groups: dict[tuple[str, str], Record | None] = field(default_factory=dict)
    """Job group settings by (queue, group id) (None: the group holds no settings any more).
    Written after the obliterated queues' groups are deleted, so a later one survives."""
    obliterated: dict[str, None] = field(default_factory=dict)
    """Queues whose stored jobs are deleted before `jobs` is written (an ordered set)."""
    skipped: int = 0
    """`upd` and `delta` mutations that found no job to update."""
    shared: set[int] = field(default_factory=set)
    """The identities of the change maps `updm`s of `SHARED_MIN` jobs or more brought: a
    stored job's patch made only of such parts is merged into one entry once for all the
    jobs that share it (`_write._shared_change`, `_patch`)."""
    runs: dict[str, Run] = field(default_factory=dict)
    """Stored jobs that only `updm`s touched, by id: the `Run` of their changes (`_runs`).
    An id that is in `jobs` as well was put or deleted after them: `jobs` holds what it
    is. Empty unless `coalesce` was asked for runs."""
    stored: Mapping[str, Stored] = field(default_factory=dict)
    """What was known of the stored rows the batch updates (`Fetch`'s answer)."""


def coalesce(
    mutations: Sequence[Mutation],
    fetch: Fetch,
    *,
    runs: bool = False,
    cached: Mapping[str, Stored] | None = None,
) -> Plan:
    """Fold `mutations` (in order) into a `Plan`; `fetch` reads what is known of stored rows.
    `runs`: keep the stored jobs only `updm`s touch in `Plan.runs` (for a writer that takes
    them, `_write.add_runs`), not as rows. `cached`: what the caller knows of stored rows
    already (its cache, `Fetch`'s answer when it holds every row asked for): the batch is
    first folded against it alone, in one pass, and only where it misses a job the batch
    updates is it folded again, after `fetch` read the rows (the plan is the same).

    Input records are never modified. Raises `StorageRejected` naming the first malformed
    mutation (unknown kind, wrong arity, wrong types, a `put` record without an id).
    """
    ops = parse_all(mutations)
    if cached:
        folder = _Folder(cached, runs, complete=False)
        try:
            folder.fold(ops)
        except _Missed:
            # The fold may have changed the column values of the ops' puts: parsed anew.
            ops = parse_all(mutations)
        else:
            return folder.plan
    # Only jobs first touched by an `upd` need their stored row: any other op on a job replaces
    # or deletes it first. The first kind seen per job says which (queue kinds are never first
    # kinds of a job id: they are kept apart by `_JOB_KINDS`).
    first: dict[str, str] = {}
    for kind, key, _a, _changes in ops:
        if kind in _JOB_KINDS:
            if key not in first:  # operators, not `setdefault`: no call per job
                first[key] = kind
        elif kind == "updm" or kind == "putm":
            first_kind = "upd" if kind == "updm" else "put"
            for one in key:
                if one not in first:
                    first[one] = first_kind
    wanted = [key for key, kind in first.items() if kind == "upd" or kind == "delta"]
    folder = _Folder(fetch(wanted), runs)
    folder.fold(ops)
    return folder.plan


class _Missed(Exception):
    """A fold against a cache (`coalesce`'s `cached`) met a job the cache does not know."""


def remember(
    cache: dict[str, Stored], limit: int, plan: Plan, known: Mapping[str, Stored | None]
) -> dict[str, Stored]:
    """The writer's cache of row summaries after `plan` committed: `known` (what the write
    learned; None: the row is gone) merged in, the obliterated queues' rows dropped, and
    trimmed to `limit`. Returns the cache to use from now on (`cache` or a new one).

    A plain dict in use order (a touched job moves to the end), trimmed in halves: one O(n)
    pass per limit/2 insertions, not one per eviction. Valid because the store's connection
    is the only writer, and called only after a commit succeeded.
    """
    if plan.obliterated:
        gone = [i for i, info in cache.items() if info[0] in plan.obliterated]
        for job_id in gone:
            del cache[job_id]
    for job_id, info in known.items():
        # Moved to the end (the cache is in use order); an operator costs less than `pop`.
        if job_id in cache:
            del cache[job_id]  # noqa: RUF051
        if info is not None and limit:
            cache[job_id] = info
    if len(cache) > limit:
        # Keep the newest half.
        keep = list(cache.items())[len(cache) - limit // 2 :] if limit > 1 else []
        return dict(keep)
    return cache


def check_columns(job_id: str, columns: Mapping[str, Any]) -> None:
    """Check the NOT NULL column fields present in `columns` (a record or changes).

    Raises `StorageRejected` naming the job and the mistyped field.
    """
    for name, value in columns.items():
        kind = _REQUIRED_TYPES.get(name)
        if kind is not None and type(value) is not kind:
            _bad_field(job_id, name, kind, value)


def check_values(job_id: str, values: Sequence[Any]) -> None:
    """Check the column values of a whole row (`COLUMN_FIELDS` order). Raises `StorageRejected`."""
    # One expression over the fixed positions (asserted below): this runs for every put.
    if type(values[0]) is not str or type(values[1]) is not str or type(values[4]) is not int:
        for index, kind in _REQUIRED_AT:
            if type(values[index]) is not kind:
                _bad_field(job_id, COLUMN_FIELDS[index], kind, values[index])


def _bad_field(job_id: str, name: str, kind: type, value: Any) -> None:
    raise StorageRejected(
        f"job {job_id!r}: record field {name!r} must be {kind.__name__}, got {value!r}"
    )


class _Folder:
    def __init__(
        self, stored: Mapping[str, Stored], runs: bool = False, *, complete: bool = True
    ) -> None:
        self.plan = Plan(stored=stored)
        self._stored = stored
        self._runs = runs
        # False: `stored` may miss a stored job, so a job it misses raises `_Missed` instead
        # of being skipped as one that does not exist.
        self._complete = complete

    def fold(self, ops: list[_Op]) -> None:
        """Fold the parsed ops in order. The two kinds nearly every batch is made of, a put
        and an update, are folded here inline: the writer's cost per job is mostly calls."""
        jobs = self.plan.jobs
        dispatch = _DISPATCH
        stored = self._stored
        obliterated = self.plan.obliterated
        for op in ops:
            kind = op[0]
            if kind == "upd" or kind == "updm":
                changes, columns = op[3], op[2]
                for key in self._keys(op):
                    row = jobs.get(key, _ABSENT)
                    if row is _ABSENT:  # first touched here: a stored job, inline (`_row`)
                        info = stored.get(key)
                        if info is not None and (not obliterated or info[0] not in obliterated):
                            row = jobs[key] = Row(None, None, info)
                        else:
                            self._skip(info)
                            continue
                    elif row is None:  # deleted earlier in the batch
                        self.plan.skipped += 1
                        continue
                    patch = row.patch
                    if type(patch) is list:
                        patch.append(changes)
                    else:
                        row.patch = [changes]
                    if columns:
                        values = row.values
                        if COLD_COLUMN in columns:  # rare: a call
                            _cold_fold(row, columns)
                        elif values is None:
                            row.changed |= columns  # an operator: no method call
                        else:
                            for name, value in columns.items():
                                values[_INDEX[name]] = value
            elif kind == "put":  # (a run may still name the job: `Plan.runs`)
                jobs[op[1]] = Row(op[2], op[3], None)
            else:
                dispatch[kind](self, op[1], op[2], op[3])

    def _skip(self, info: Stored | None) -> None:
        """Count an update of a job that does not exist at this point of the batch: not
        stored (`info` None) or its stored queue obliterated. Raises `_Missed` if `info` is
        None and the stored rows known may miss it."""
        if info is None and not self._complete:
            raise _Missed
        self.plan.skipped += 1

    def _keys(self, op: _Op) -> Sequence[str]:
        """The keys of an `upd` or `updm` that `fold` takes into rows: all of them, or, for
        an `updm` where the plan keeps runs, those with a row in the plan (or deleted in the
        batch), the others folded into runs here (`_run_updates`). Not into runs: a change
        that names a cold field (a call each, `_cold_fold`), and one that is a 0- or 1-byte
        bytes object (CPython keeps one of each: it may stand for different columns). A job
        of a run that `fold` takes is given its row first (`_unrun`). An `updm` of
        `SHARED_MIN` keys or more adds its change map to `Plan.shared`."""
        runs = self.plan.runs
        if op[0] == "upd":
            if op[1] in runs:
                self._unrun(op[1])
            return (op[1],)
        keys: Any = op[1]  # an `updm`'s: a list of keys (`_Op`)
        columns, changes = op[2], op[3]
        if len(keys) >= SHARED_MIN:
            self.plan.shared.add(id(changes))
        if self._runs and COLD_COLUMN not in columns and len(changes) > 1:
            return self._run_updates(keys, columns, changes)
        if runs:
            for key in keys:
                if key in runs:
                    self._unrun(key)
        return keys  # type: ignore[no-any-return]

    def _unrun(self, key: str) -> None:
        """Give a job of a run its row (`Row.of_run`), for `fold` to take a change into;
        unless the plan holds its row or its deletion already (`Plan.runs`)."""
        jobs = self.plan.jobs
        if key not in jobs:
            jobs[key] = Row.of_run(self.plan.runs.pop(key), self._stored[key])

    def _run_updates(self, keys: list[str], columns: dict[str, Any], changes: bytes) -> list[str]:
        """Fold an `updm` into runs (`_runs`): a stored job it touches first joins one new
        run, a job in a run moves to that run's successor. Returns the keys left for `fold`
        to take into their rows: those with a row in the plan (or deleted in the batch)."""
        jobs, runs, stored = self.plan.jobs, self.plan.runs, self._stored
        obliterated = self.plan.obliterated
        first: Run | None = None
        rest: list[str] = []
        # The jobs of one run come one after the other: its successor is asked for once.
        before: Run | None = None
        after: Any = None  # `before`'s successor
        for key in keys:
            if key in jobs:
                rest.append(key)
                continue
            run = runs.get(key)
            if run is not None:
                if run is not before:
                    before, after = run, run.then(changes, columns)
                runs[key] = after
                continue
            info = stored.get(key)
            if info is None or (obliterated and info[0] in obliterated):
                self._skip(info)
            elif first is None:
                first = runs[key] = Run([changes], columns)
            else:
                runs[key] = first
        return rest

    def _delta(self, job_id: str, _a: None, op: Part) -> None:
        row = self._row(job_id)
        if row is None:
            return
        if row.values is None:
            deltas = row.deltas
            if type(deltas) is list:
                deltas.append(op)
            else:
                row.deltas = [op]
        else:
            # A patch entry may hold a delta op (`_deltas`).
            patch = row.patch
            if type(patch) is list:
                patch.append(wrap(op))
            else:
                row.patch = [wrap(op)]

    def _row(self, job_id: str, row: Any = _ABSENT) -> Row | None:
        """The plan's row of `job_id`, made from its run (`Plan.runs`) or its stored summary
        if need be; None (and counted as skipped) if the job does not exist at this point of
        the batch. `row`: what the plan holds for it, if the caller looked already."""
        jobs = self.plan.jobs
        if row is _ABSENT:
            row = jobs.get(job_id, _ABSENT)
        if row is _ABSENT and job_id in self.plan.runs:
            run = self.plan.runs.pop(job_id)
            row = jobs[job_id] = Row.of_run(run, self._stored[job_id])
        if row is _ABSENT:
            stored = self._stored.get(job_id)
            if stored is None or stored[0] in self.plan.obliterated:
                # Never stored, or untouched until now, so its stored queue was obliterated.
                self._skip(stored)
                return None
            row = jobs[job_id] = Row(None, None, stored)
        elif row is None:
            self.plan.skipped += 1
            return None
        assert isinstance(row, Row)
        return row

    def _putm(self, keys: Sequence[str], columns: list[Any], rows: tuple[Any, Any]) -> None:
        """A `putm`: the `put` of each job in turn, each `Row` with its own column values (a
        later change in the batch may set one), made in C but for `Row.__init__`."""
        queue, state, priority, run_at = columns
        seqs, recs = rows
        values = map(
            list, zip(repeat(queue), repeat(state), repeat(priority), repeat(run_at), seqs)
        )
        # As `jobs[key] = row` one by one: a key the plan holds keeps its place.
        self.plan.jobs.update(zip(keys, map(Row, values, recs, repeat(None)), strict=True))

    def _del(self, job_id: str, _a: None, _b: None) -> None:
        self.plan.jobs[job_id] = None

    def _queue(self, name: str, cfg: Record, _b: None) -> None:
        self.plan.queues[name] = cfg

    def _cron(self, name: str, rec: Record, _b: None) -> None:
        self.plan.crons[name] = rec

    def _crondel(self, name: str, queue: str | None, _b: None) -> None:
        plan = self.plan
        if queue is None:
            plan.crons[name] = None
            return
        pending = plan.crons.get(name)
        if pending is not None and pending.get("queue") == queue:
            # Saved earlier in this batch on that queue: that save replaced whatever was
            # stored (on any queue), so the schedule is gone whatever the stored row says.
            plan.crons[name] = None
            return
        plan.cron_drops[(name, queue)] = None

    def _webhook(self, hook_id: str, rec: Record, _b: None) -> None:
        self.plan.webhooks[hook_id] = rec

    def _webhookdel(self, hook_id: str, _a: None, _b: None) -> None:
        self.plan.webhooks[hook_id] = None

    def _flow(self, key: str, rec: Record, _b: None) -> None:
        self.plan.flows[key] = rec

    def _flowdel(self, key: str, _a: None, _b: None) -> None:
        self.plan.flows[key] = None

    def _group(self, queue: str, gid: str, cfg: Record) -> None:
        self.plan.groups[(queue, gid)] = cfg

    def _groupdel(self, queue: str, gid: str, _b: None) -> None:
        self.plan.groups[(queue, gid)] = None

    def _qdrain(self, name: str, _seq: int, _b: None) -> None:
        # A range deletion is written where it stands among the batch's writes: the batch
        # is applied as the steps around it instead (`shardq.storage._drain`).
        raise DrainInBatch(name)

    def _qdel(self, name: str, _a: None, _b: None) -> None:
        expand_runs(self.plan)  # rare: its rows are looked at one by one below
        self.plan.queues[name] = None
        self.plan.obliterated[name] = None
        groups = self.plan.groups
        for key in [k for k in groups if k[0] == name]:
            del groups[key]  # the queue's stored groups are deleted with it, these never land
        jobs = self.plan.jobs
        for job_id in [j for j, row in jobs.items() if row is not None and row.queue == name]:
            jobs[job_id] = None


def expand_runs(plan: Plan) -> None:
    """Turn `plan`'s runs into the rows they stand for (`Row.of_run`), for a step that reads
    `Plan.jobs` row by row: an obliterate, a pending Drain range (`_drain_pending`)."""
    runs, stored, jobs = plan.runs, plan.stored, plan.jobs
    for job_id, run in runs.items():
        if job_id not in jobs:  # else put or deleted after the run's changes
            jobs[job_id] = Row.of_run(run, stored[job_id])
    runs.clear()


# The kinds `fold` does not fold inline. Functions, not a map of the folder's bound methods
# kept on the folder: that map would make every folder a reference cycle, and with it its plan,
# every row and their lists would wait for the cyclic garbage collector instead of going when
# the batch is written (6 objects a job: 1.7 of the writer's 15 µs per ppa1q job went to the
# collections that freed them).
_DISPATCH: dict[str, Callable[[_Folder, str, Any, Any], None]] = {
    "putm": _Folder._putm,  # its key is a list of keys
    "delta": _Folder._delta,
    "del": _Folder._del,
    "queue": _Folder._queue,
    "qdel": _Folder._qdel,
    "qdrain": _Folder._qdrain,
    "cron": _Folder._cron,
    "crondel": _Folder._crondel,
    "webhook": _Folder._webhook,
    "webhookdel": _Folder._webhookdel,
    "flow": _Folder._flow,
    "flowdel": _Folder._flowdel,
    "group": _Folder._group,
    "groupdel": _Folder._groupdel,
}


def _cold_fold(row: Row, columns: Mapping[str, Any]) -> None:
    """Fold a change that names a cold field into `row` (`_cold_change`, `_cold_stored_change`)."""
    if row.values is None:
        _cold_stored_change(row.changed, columns)
    else:
        _cold_change(row.values, columns)


def _cold_change(values: list[Any], columns: Mapping[str, Any]) -> None:
    """Apply a change that names a cold field (`_cold`) to the column values of a job put in
    this batch: its cold fields are then read from its merged record when it is written."""
    for name, value in columns.items():
        if name != COLD_COLUMN:
            values[_INDEX[name]] = value
    if columns[COLD_COLUMN] or len(values) > _COLUMNS:
        values[_COLUMNS:] = [REFILL]


def _cold_stored_change(changed: dict[str, Any], columns: Mapping[str, Any]) -> None:
    """Merge a change that names a cold field into a stored row's changed columns: a 1 (the
    change made it cold) stays for the batch, whatever later changes name."""
    mark = max(columns[COLD_COLUMN], changed.get(COLD_COLUMN, 0))
    changed.update(columns)
    changed[COLD_COLUMN] = mark


_COLUMNS = len(COLUMN_FIELDS)
_JOB_KINDS = frozenset({"put", "upd", "delta", "del"})
