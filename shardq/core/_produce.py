"""PUSH and PUSHB: admission, custom-id idempotency and uniqueKey deduplication."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeGuard, cast

from shardq.errors import CommandError
from shardq.protocol._schema import REWRITTEN_JOB_KEYS, normalize_job, push_allowed

from ._effects import Effects
from ._graph import graph_error
from ._groups import group_size_error
from ._job import Job, payload_only
from ._lifecycle import QUEUED_STATES, TERMINAL_STATES
from ._options import as_int, certainly_small, validate_data, validate_name, validate_queue_name
from ._repeat import check_repeat, successor
from ._state import JobStore
from ._tables import claim_unique
from ._validate import JOB_FIELDS, MAX_COUNT, validate_job

__all__ = ["Producer"]

PUSH_KEYS: Final = push_allowed("PUSH")
# The push fields whose checks read the engine's state or parse a schedule (`_check_push`).
_CROSS_CHECKED: Final = frozenset(("repeat", "dependsOn", "childrenIds", "groupMaxSize"))
# The keys of a push that nothing rewrites, checks or cross-checks beyond its queue, data
# and name: a push with no others (the common one) skips the option passes.
_PLAIN_PUSH_KEYS: Final = (PUSH_KEYS - REWRITTEN_JOB_KEYS - JOB_FIELDS - _CROSS_CHECKED) | {"name"}
# The one option the task API sends with every call (shardq/tasks, for the remote traceback):
# an int in range needs no rewriting and no other check, so it keeps a push on the plain path.
_TRACE_LIMIT: Final = "stackTraceLimit"
_PLAIN_TRACED_KEYS: Final = _PLAIN_PUSH_KEYS | {_TRACE_LIMIT}
# A single PUSH may also carry `"durable": true` (bunqueue-client's durable add): a valid flag
# that `Job.create` keeps in `opts` as the full passes would (`_plain_single`).
_PLAIN_SINGLE_KEYS: Final = _PLAIN_TRACED_KEYS | {"durable"}
_PLAIN_ENTRY_KEYS: Final = frozenset(("data", "name"))
_PLAIN_TRACED_ENTRY_KEYS: Final = _PLAIN_ENTRY_KEYS | {_TRACE_LIMIT}


def _plain(cmd: Mapping[str, Any]) -> bool:
    """Whether a PUSH carries nothing the full passes (`normalize_job`, `validate_job`,
    `_check_push`) would rewrite or check beyond its queue, data and name."""
    keys = cmd.keys()
    if keys <= _PLAIN_PUSH_KEYS:
        return True
    return keys <= _PLAIN_TRACED_KEYS and _plain_limit(cmd[_TRACE_LIMIT])


def _plain_single(cmd: Mapping[str, Any]) -> bool:
    """`_plain`, or as plain but for `"durable": true`: for `cmd_push` alone. A run of pushes
    (`push_run`) answers each at once, where a durable push's reply waits for its commit, so
    `push_run` keeps to `_plain`."""
    keys = cmd.keys()
    if keys <= _PLAIN_PUSH_KEYS:
        return True
    if not keys <= _PLAIN_SINGLE_KEYS or cmd.get("durable", True) is not True:
        return False
    return _TRACE_LIMIT not in keys or _plain_limit(cmd[_TRACE_LIMIT])


def _plain_entry(entry: Mapping[str, Any]) -> bool:
    """`_plain` for a PUSHB entry: only data, name and an int stackTraceLimit."""
    keys = entry.keys()
    if keys <= _PLAIN_ENTRY_KEYS:
        return True
    return keys <= _PLAIN_TRACED_ENTRY_KEYS and _plain_limit(entry[_TRACE_LIMIT])


def _plain_limit(limit: object) -> bool:
    return type(limit) is int and 0 <= limit <= MAX_COUNT  # what `count` accepts, unrewritten


def _data_only(entries: object) -> TypeGuard[list[Mapping[str, Any]]]:
    """Whether a PUSHB's jobs are all `{"data": ...}` with valid data, at least one (what
    `bunqueue-client`'s `add_bulk` and a bulk push without options send), or all of one
    such shape with a `name` and/or `"durable": true` (`payload_only`): then `_entries`,
    the custom-id scan and `_validate_batch` have nothing to say, and it is admitted as
    `cmd_pushb`'s plain path would. Raises the first entry's data or name error as
    `_validate_batch` would (there is no other error for such a batch)."""
    if type(entries) is not list or not entries:
        return False
    first = entries[0]
    if type(first) is not dict or not payload_only(first):
        return False
    # Entries with the first's keys are payload-only as it is, but for `durable`'s value.
    keys = first.keys()
    durable = "durable" in keys
    # In the same pass, whether every entry is unnamed with data `validate_data` waves
    # through first (`certainly_small`): then there is nothing to check, the common case.
    checks = "name" in keys
    small = certainly_small
    for entry in entries:
        if type(entry) is not dict or entry.keys() != keys:
            return False
        if durable and entry["durable"] is not True:
            return False
        if not checks and not small(entry["data"]):
            checks = True
    if not checks:
        return True
    named = "name" in keys
    for index, entry in enumerate(entries):
        if not named and small(entry["data"]):
            continue
        error = validate_data(entry["data"]) or (validate_name(entry) if named else None)
        if error:
            raise CommandError(f"jobs[{index}]: {error}")
    return True


def custom_id_of(value: object) -> str | None:
    """A custom id as the wire sends it: a string, or a number sent as its decimal form."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    text = str(value) if isinstance(value, str | int | float) else None
    return text or None


def _entries(entries: object) -> list[Mapping[str, Any]]:
    """A PUSHB's jobs, each in its canonical form (`normalize_job`)."""
    if not isinstance(entries, list):
        raise CommandError("jobs must be an array of job objects")
    for index, entry in enumerate(entries):
        if type(entry) is not dict:
            raise CommandError("jobs must be an array of job objects")
        if not _plain_entry(entry):  # {data}, a name, an int stackTraceLimit: no rewriting
            error = normalize_job(entry)
            if error:
                raise CommandError(f"jobs[{index}]: {error}")
    return cast("list[Mapping[str, Any]]", entries)


class Producer:
    """PUSH and PUSHB over the job store (the engine's `produce` component), and the pushes
    the other parts make: a cron slot's job, a repeat's successor, a flow's nodes."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.config = store.config
        self.ids = store.ids
        self.jobs = store.jobs
        self.queues = store.queues

    def cmd_push(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        queue = cmd.get("queue")
        if _plain_single(cmd):  # what the full passes below would check of it
            error = validate_queue_name(queue) or validate_data(cmd.get("data"))
            error = error or validate_name(cmd)
            if error:
                raise CommandError(error)
            custom = None
            return {"ok": True, "id": self.push_one(fx, str(queue), cmd, custom, now)}
        error = (
            validate_queue_name(queue)
            or normalize_job(cmd, PUSH_KEYS)  # type: ignore[arg-type]
            or validate_job(cmd, self.config.max_key_chars)
        )
        if error:
            raise CommandError(error)
        queue = str(queue)
        if not _CROSS_CHECKED.isdisjoint(cmd):  # one set test for a push with none of them
            self._check_push(queue, cmd)
        custom = custom_id_of(cmd["jobId"]) if "jobId" in cmd else None
        return {"ok": True, "id": self.push_one(fx, queue, cmd, custom, now)}

    def push_run(self, fx: Effects, commands: Sequence[Mapping[str, Any]], now: int) -> list[str]:
        """The longest run of `commands` from the first that are PUSHes taken by `cmd_push`'s
        plain path without an error, of one queue or several, admitted in one pass: the ids,
        sequence numbers, records and counts they would get one by one (`_push_plain`).
        Returns their ids; the caller runs the rest, from the first one not taken, as usual.
        Several queues (pipelined pushes spread over queues): the jobs are built in arrival
        order (ids and seqs as one by one), then each queue's are placed together, the queues
        in the order they first appear; only the order of the mutations across queues differs
        from one by one, and no two of them touch the same row."""
        valid: set[str] = set()
        taken = 0
        for cmd in commands:
            queue = cmd.get("queue")
            if type(queue) is not str:
                break  # the one-by-one path answers its error
            if queue not in valid:
                if validate_queue_name(queue):
                    break
                valid.add(queue)
            if not _plain(cmd):
                break
            if validate_data(cmd.get("data")) or validate_name(cmd):
                break
            taken += 1
        if not taken:
            return []
        if len(valid) == 1:
            return self._push_plain(fx, valid.pop(), list(commands[:taken]), now, Job.create_plain)
        return self._push_mixed(fx, commands[:taken], now)

    def _push_mixed(
        self, fx: Effects, commands: Sequence[Mapping[str, Any]], now: int
    ) -> list[str]:
        """`push_run`'s plain PUSHes of several queues: built in order, placed per queue."""
        create = Job.create_plain  # plain PUSHes (`_plain`): no time, priority or attempts
        store = self.store
        seq = store.seq
        ids = self.ids.new_many(now, len(commands))
        by_queue: dict[str, list[Job]] = {}
        for job_id, cmd in zip(ids, commands, strict=True):
            seq += 1
            queue = cmd["queue"]
            job = create(job_id, queue, seq, cmd, now)
            group = by_queue.get(queue)
            if group is None:
                by_queue[queue] = [job]
            else:
                group.append(job)
        store.seq = seq
        for queue, jobs in by_queue.items():
            store.admit_all(fx, jobs, store.queue(queue), now)
        return ids

    def _check_push(self, queue: str, cmd: Mapping[str, Any]) -> None:
        """The checks of a single push that read more than its own fields."""
        if cmd.get("repeat") is not None:
            error = check_repeat(cmd["repeat"])
            if error:
                raise CommandError(error)
        # A flow parent's children may live on other shards: its fan-in waits for them.
        self._check_deps(cmd.get("dependsOn"), set(cmd.get("childrenIds") or ()))
        if cmd.get("groupMaxSize") is not None:
            self._check_group_sizes(queue, (cmd,))

    def cmd_pushb(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        queue = cmd.get("queue")
        error = validate_queue_name(queue)
        if error:
            raise CommandError(error)
        jobs = cmd.get("jobs")
        if _data_only(jobs):  # what the passes below would check of it, in one
            return {"ok": True, "ids": self._push_payloads(fx, str(queue), jobs, now)}
        entries = _entries(jobs)
        customs: list[str | None] = []
        plain = True  # no custom id, no uniqueKey: no entry can be a duplicate
        for entry in entries:
            custom = custom_id_of(entry["customId"]) if "customId" in entry else None
            if custom is not None or isinstance(entry.get("uniqueKey"), str):
                plain = False
            customs.append(custom)
        queue = str(queue)
        if self._validate_batch(entries, customs):
            self._check_group_sizes(queue, entries)
        if plain and entries:
            return {"ok": True, "ids": self._push_plain(fx, queue, entries, now)}
        ids: list[str] = []
        for index, entry in enumerate(entries):
            try:
                ids.append(self.push_one(fx, queue, entry, customs[index], now))
            except CommandError as e:
                # Accepted prefix: entries before this one stay admitted (bunqueue semantics).
                raise CommandError(f"jobs[{index}]: {e}") from e
        return {"ok": True, "ids": ids}

    # -- validation ------------------------------------------------------------------------

    def _validate_batch(
        self, entries: Sequence[Mapping[str, Any]], customs: Sequence[str | None]
    ) -> bool:
        """Refuse the batch if any entry is invalid. True if an entry sets groupMaxSize."""
        batch_ids = {c for c in customs if c is not None}
        max_chars = self.config.max_key_chars
        sized = False
        for index, entry in enumerate(entries):
            if "groupMaxSize" in entry:
                sized = True
            if _plain_entry(entry):  # what `validate_job` would check of it
                error = validate_data(entry.get("data")) or validate_name(entry)
            else:
                error = validate_job(entry, max_chars)
            if not error and "repeat" in entry and entry["repeat"] is not None:
                error = check_repeat(entry["repeat"])
            if error:
                raise CommandError(f"jobs[{index}]: {error}")
            if "dependsOn" not in entry:
                continue
            own = customs[index]
            for dep in entry.get("dependsOn") or ():
                if str(dep) == own:
                    raise CommandError(f"jobs[{index}]: Job cannot depend on itself: {dep}")
            try:
                children = set(entry.get("childrenIds") or ())
                self._check_deps(entry.get("dependsOn"), batch_ids | children)
            except CommandError as e:
                raise CommandError(f"jobs[{index}]: {e}") from None
        if batch_ids:  # only entries with a custom id can be waited for within the batch
            named = ((c, e) for c, e in zip(customs, entries, strict=True) if c is not None)
            error = graph_error(named)
            if error:
                raise CommandError(error)
        return sized

    def _check_group_sizes(self, queue: str, entries: Sequence[Mapping[str, Any]]) -> None:
        q = self.queues.get(queue)
        error = group_size_error(q.groups if q is not None else None, entries)
        if error:
            raise CommandError(error)

    def _check_deps(self, deps: object, batch_ids: set[str]) -> None:
        for dep in deps or ():  # type: ignore[attr-defined]
            key = str(dep)
            if key in batch_ids or key in self.jobs or key in self.store.dep_done:
                continue
            if self.store.cold_lookup is None or self.store.find(key) is None:
                raise CommandError(f"Dependency job not found: {key}")

    # -- admission -------------------------------------------------------------------------

    def push_successor(self, fx: Effects, job: Job, now: int) -> None:
        """Push the successor of a completed job with a `repeat` option (`_repeat.py`); the
        consume component calls it when such a job completes."""
        try:
            fields = successor(job, now)
        except CommandError:
            return  # a pattern that matches no future date (30 February): the chain ends
        if fields is not None:
            self.push_one(fx, job.queue, fields, None, now)

    def push_one(
        self, fx: Effects, queue: str, fields: Mapping[str, Any], custom: str | None, now: int
    ) -> str:
        """Admit one validated job, or return the id of the live job it duplicates."""
        if custom is not None:
            existing = self.jobs.get(custom)
            if existing is None and self.store.cold_lookup is not None:
                existing = self.store.cold_lookup(custom, None)  # ids are shard-wide
            if existing is not None:
                if existing.state not in TERMINAL_STATES:
                    return existing.id
                # A terminal generation is retired so the id can start a fresh one.
                self.store.remove(fx, existing)
        key = fields.get("uniqueKey") if "uniqueKey" in fields else None
        if isinstance(key, str):
            owner_id = self._dedup(fx, queue, key, fields, now)
            if owner_id is not None:
                return owner_id
        job_id = custom if custom is not None else self.ids.new(now)
        store = self.store
        store.seq = seq = store.seq + 1
        job = Job.create(job_id, queue, seq, fields, now, custom=custom is not None)
        if isinstance(key, str):
            ttl = _dedup_options(fields).get("ttl")
            job.dedup_until = now + as_int(ttl, 0) if ttl else None
            claim_unique(store, job)
        store.admit(fx, job, now)
        return job.id

    def _push_plain(
        self,
        fx: Effects,
        queue: str,
        entries: list[Mapping[str, Any]],
        now: int,
        create: Callable[[str, str, int, Mapping[str, Any], int], Job] = Job.create,
    ) -> list[str]:
        """Admit validated entries that have neither a custom id nor a uniqueKey: none of them
        can be a duplicate, so they are built first and placed in one pass (as `push_one`
        would, one by one: the same ids, sequence numbers and records). `create`: how each
        job is made (`Job.create_plain` for plain PUSHes and payload-only PUSHB entries,
        whose fields it reads fewer of)."""
        store = self.store
        seq = store.seq
        jobs: list[Job] = []
        for job_id, entry in zip(self.ids.new_many(now, len(entries)), entries, strict=True):
            seq += 1
            jobs.append(create(job_id, queue, seq, entry, now))
        store.seq = seq
        store.admit_all(fx, jobs, store.queue(queue), now)
        return [job.id for job in jobs]

    def _push_payloads(
        self, fx: Effects, queue: str, entries: list[Mapping[str, Any]], now: int
    ) -> list[str]:
        """`_push_plain` of a `_data_only` PUSHB's entries (payload-only fields set no time,
        priority or attempts: `create_plain` makes the job `create` would): the same ids,
        jobs and records, each step once for all the entries (`IdFactory.new_many`,
        `FreshRecords.payload_jobs`)."""
        store = self.store
        ids = self.ids.new_many(now, len(entries))
        jobs, puts = store.fresh.payload_jobs(ids, queue, store.seq, entries, now)
        store.seq += len(jobs)
        store.admit_waiting(fx, ids, jobs, store.queue(queue), now, puts)
        return ids

    def _live_owner(self, queue: str, key: str, now: int) -> Job | None:
        unique = self.store.unique
        owner_id = unique.get((queue, key))
        owner = self.jobs.get(owner_id) if owner_id is not None else None
        if owner is None and self.store.cold_lookup is not None:
            owner = self._cold_owner(queue, key, owner_id)
        if owner is None:
            unique.pop((queue, key), None)
            return None
        if owner.dedup_until is not None and owner.dedup_until <= now:
            del unique[(queue, key)]
            return None
        return owner

    def _cold_owner(self, queue: str, key: str, owner_id: str | None) -> Job | None:
        """Under a head budget: the claim's owner may be cold, or (after a start) the claim
        itself is not in memory while its cold owner is."""
        store = self.store
        if owner_id is not None:
            return store.cold_lookup(owner_id, queue) if store.cold_lookup else None
        owner = store.cold_owner(queue, key) if store.cold_owner else None
        if owner is not None:
            store.unique[(queue, key)] = owner.id
        return owner

    def _dedup(
        self, fx: Effects, queue: str, key: str, fields: Mapping[str, Any], now: int
    ) -> str | None:
        """The owner's id when the push is a duplicate; None to admit a new job."""
        owner = self._live_owner(queue, key, now)
        if owner is None:
            return None
        policy = _dedup_options(fields)
        if policy.get("replace"):
            return self._dedup_replace(fx, owner)
        if policy.get("extend") and policy.get("ttl"):
            owner.dedup_until = now + as_int(policy["ttl"], 0)
            fx.mutations.append(("upd", owner.key, {"dedupUntil": owner.dedup_until}))
            if owner.state in QUEUED_STATES:
                return owner.id
            raise CommandError("Duplicate unique_key (extended TTL)")
        return owner.id

    def _dedup_replace(self, fx: Effects, owner: Job) -> str | None:
        if owner.state in QUEUED_STATES:
            dependents = self.store.dependents.get(owner.id, ())
            if any(self.jobs.get(child) is not None for child in dependents):
                raise CommandError(
                    f"Cannot replace deduplicated job {owner.id} because live jobs depend on it"
                )
            self.store.remove(fx, owner)
            return None
        # An active owner keeps running under its lease; the key moves to the successor.
        return None


def _dedup_options(fields: Mapping[str, Any]) -> Mapping[str, Any]:
    dedup = fields.get("dedup")
    return dedup if isinstance(dedup, Mapping) else {}
