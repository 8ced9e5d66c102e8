"""The job record: bunqueue's `Job` fields and defaults (docs/protocol.md §4.1 and §5.3).

Fields the engine reads or changes on the hot path are attributes. The options a job only
carries (tags, groupId, removeOnComplete, ...) live in `opts`, a dict already in wire form, so
building the wire map is one dict copy plus the hot fields.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeAlias

from ._lifecycle import WAITING
from ._mutations import ROW_KEY_SEP
from ._options import as_int, is_number
from ._record import (
    DEFAULT_MAX_ATTEMPTS,
    ENGINE_KEYS,
    HOT_KEYS,
    RECORD_DEFAULTS,
    RECORD_TEMPLATE,
    drop_defaults,
)

__all__ = [
    "DEFAULT_MAX_BACKOFF_MS",
    "TIMELINE_MAX",
    "WIRE_HOT_KEYS",
    "WIRE_TEMPLATE",
    "Job",
    "Timeline",
    "backoff_delay",
    "payload_only",
    "wire_maps",
]

DEFAULT_BACKOFF_MS: Final = 1000
# bunqueue caps every computed backoff at one hour unless backoff.maxDelay says otherwise.
DEFAULT_MAX_BACKOFF_MS: Final = 3_600_000
DEFAULT_STACK_TRACE_LIMIT: Final = 10
# (state, timestamp, attempt) entries, oldest first.
Timeline: TypeAlias = tuple[tuple[str, int, int | None], ...]
# bunqueue's MAX_TIMELINE_ENTRIES.
TIMELINE_MAX: Final = 20

# Options copied verbatim (after defaults) into `opts`. Order is the wire order.
_BOOL_OPTS: Final = (
    "removeOnComplete",
    "removeOnFail",
    "durable",
    "failParentOnFailure",
    "removeDependencyOnFailure",
    "continueParentOnFailure",
    "ignoreDependencyOnFailure",
)
_NULLABLE_OPTS: Final = (
    "ttl",
    "timeout",
    "stallTimeout",
    "uniqueKey",
    "parentId",
    "groupId",
    "repeat",
    "keepLogs",
    "sizeLimit",
    "debounceId",
    "debounceTtl",
)
_LIST_OPTS: Final = ("dependsOn", "childrenIds", "tags")

_BOOL_SET: Final = frozenset(_BOOL_OPTS)
_LIST_SET: Final = frozenset(_LIST_OPTS)
_OPTION_KEYS: Final = frozenset(
    (*_BOOL_OPTS, *_NULLABLE_OPTS, *_LIST_OPTS, "backoff", "dedup", "stackTraceLimit")
) | {"parentQueue"}  # shardq's: where a flow child's parent lives (docs/protocol.md §20)
# The wire value of every option a push did not set.
_WIRE_DEFAULTS: Final[dict[str, Any]] = {
    "backoff": DEFAULT_BACKOFF_MS,
    "backoffConfig": None,
    **dict.fromkeys(_NULLABLE_OPTS),
    **{key: [] for key in _LIST_OPTS},
    **dict.fromkeys(_BOOL_OPTS, False),
    "customId": None,
    "stackTraceLimit": DEFAULT_STACK_TRACE_LIMIT,
}

_HOT: Final = HOT_KEYS
_ENGINE: Final = ENGINE_KEYS
# The options of a job that has none: one shared, read-only empty map instead of an empty dict
# per job (the engine keeps up to 50,000 completed jobs, and the GC visits what they hold).
NO_OPTIONS: Final[Mapping[str, Any]] = MappingProxyType({})
# "cold": the storage's mark of a job stored outside the engine's memory (`_head.py`); a job
# paged in and then pulled keeps it in its row, and a restart reads that row back.
_NOT_OPTIONS: Final = frozenset((*_HOT, *_ENGINE, "returnvalue", "hasResult", "rowKey", "cold"))
assert _NOT_OPTIONS.issuperset(RECORD_DEFAULTS), "only engine fields may be left out"
# Every key of a wire map, resp. of a record, of a job without options, in order: copying one
# and filling it in is cheaper than building the map key by key.
_WIRE_TEMPLATE: Final[dict[str, Any]] = {**_WIRE_DEFAULTS, **dict.fromkeys(_HOT)}
WIRE_TEMPLATE: Final[Mapping[str, Any]] = MappingProxyType(_WIRE_TEMPLATE)
"""The keys of every wire map in order, with the values of a job without options; the ones
in `WIRE_HOT_KEYS` (at the end) vary per job."""
WIRE_HOT_KEYS: Final = _HOT


class Job:
    """One job. Mutated only by the engine; every change is mirrored in a mutation."""

    __slots__ = (
        "attempts",
        "children_completed",
        "completed_at",
        "created_at",
        "data",
        "dedup_until",
        "delivery",
        "dkey",
        "dlq",
        "dlq_retries",
        "failed_reason",
        "has_result",
        "hkey",
        "id",
        "key",
        "last_heartbeat",
        "leased",
        "lifo",
        "logs",
        "logs_added",
        "max_attempts",
        "name",
        "opts",
        "priority",
        "progress",
        "progress_message",
        "queue",
        "result",
        "run_at",
        "seq",
        "stacktrace",
        "stall_count",
        "started_at",
        "state",
        "timeline",
        "token",
    )

    def __init__(self, job_id: str, queue: str, seq: int) -> None:
        self.id = job_id
        # The row this job is stored under: its id, which is unique across the server, except
        # for a custom id, which a client may reuse on queues that other shards own.
        self.key = job_id
        self.queue = queue
        self.seq = seq
        self.name = "default"
        self.data: Any = None
        self.priority: float = 0
        self.created_at = 0
        self.run_at = 0
        self.started_at: int | None = None
        self.completed_at: int | None = None
        self.attempts = 0
        self.max_attempts = DEFAULT_MAX_ATTEMPTS
        self.progress: float = 0
        self.progress_message: str | None = None
        self.stacktrace: list[str] | None = None
        self.last_heartbeat = 0
        self.stall_count = 0
        self.children_completed = 0
        self.lifo = False
        # A tuple of (state, timestamp, attempt) triples. Tuples of plain values are objects
        # the cyclic GC stops tracking at its first pass (a list stays tracked), and the engine
        # keeps up to 50,000 completed jobs that collections walk. Jobs admitted and moved
        # together share their timeline (`JobStore.move_run` extends it). `timeline_view`
        # gives the wire form.
        self.timeline: Timeline = ()
        self.opts: Mapping[str, Any] = NO_OPTIONS
        self.state = WAITING
        self.failed_reason: str | None = None
        self.dlq: dict[str, Any] | None = None
        self.dlq_retries = 0
        self.logs: list[dict[str, Any]] | None = None
        self.logs_added = 0  # log entries ever added: numbers each one (`_mutations`, "log")
        self.dedup_until: int | None = None
        self.result: Any = None
        self.has_result = False
        # Not persisted: heap entries this job currently owns, and its delivery fencing.
        self.hkey: tuple[Any, ...] | None = None
        self.dkey: tuple[Any, ...] | None = None
        self.delivery = 0
        # Every delivery gets a token, with or without an owner (`_consume._hold`); `leased`
        # says whether a lease guards it, which decides what a token-less ACK may match.
        self.token: str | None = None
        self.leased = False

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        job_id: str,
        queue: str,
        seq: int,
        fields: Mapping[str, Any],
        now: int,
        *,
        custom: bool = False,
    ) -> Job:
        """A new job from validated push fields (see `_validate.validate_job`)."""
        job = cls(job_id, queue, seq)
        if not custom and payload_only(fields):
            # Just the payload (a PUSHB entry without options), perhaps named or durable:
            # every other field is default.
            job._payload(fields, now)
            if "durable" in fields:
                job.opts = {"durable": True}  # as `_options` has it; each job its own
            return job
        get = fields.get
        job.data = data = get("data")
        name = get("name")
        if isinstance(name, str) and name:
            job.name = name
        elif type(data) is dict:
            job.name = _legacy_name(data)
        # Absent options are the common case: test for None before parsing numbers.
        priority = get("priority")
        if priority is not None:
            job.priority = _number(priority, 0)
        stamp = get("timestamp")
        created = now if stamp is None else as_int(stamp, now)
        job.created_at = job.last_heartbeat = created
        delay = get("delay")
        job.run_at = created if delay is None else created + as_int(delay, 0)
        attempts = get("maxAttempts")
        if attempts is not None:
            job.max_attempts = as_int(attempts, DEFAULT_MAX_ATTEMPTS)
        job.lifo = bool(get("lifo", False))
        if custom or not _OPTION_KEYS.isdisjoint(fields):
            job.opts = _options(fields, job_id if custom else None)
        if custom:
            job.key = f"{job_id}{ROW_KEY_SEP}{queue}"
        return job

    @classmethod
    def create_plain(
        cls, job_id: str, queue: str, seq: int, fields: Mapping[str, Any], now: int
    ) -> Job:
        """`create` (without a custom id) of fields that set no time, delay, priority,
        attempts or lifo, as a plain PUSH's (`_produce._plain`): the same job, fewer lookups."""
        job = cls(job_id, queue, seq)
        job._payload(fields, now)
        if not _OPTION_KEYS.isdisjoint(fields):
            job.opts = _options(fields, None)
        return job

    def _payload(self, fields: Mapping[str, Any], now: int) -> None:
        """The data, the name (given, or the data's legacy one) and the times of a job pushed
        `now` without a timestamp or delay."""
        self.data = data = fields.get("data")
        name = fields.get("name")
        if isinstance(name, str) and name:
            self.name = name
        elif type(data) is dict:
            self.name = _legacy_name(data)
        self.created_at = self.last_heartbeat = self.run_at = now

    @property
    def custom_id(self) -> str | None:
        value = self.opts.get("customId")
        return value if isinstance(value, str) else None

    @property
    def unique_key(self) -> str | None:
        value = self.opts.get("uniqueKey")
        return value if isinstance(value, str) else None

    # -- wire and record forms ------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The bunqueue `Job` map, as PULL returns it."""
        # This runs once per delivered job. A job without options copies a template that
        # already holds every key in wire order, so filling it in never grows the dict.
        if self.opts:
            wire = {
                **_WIRE_DEFAULTS,
                # Fresh lists: a caller may mutate the map it got.
                "dependsOn": [],
                "childrenIds": [],
                "tags": [],
                **self.opts,
            }
            if "flowPending" in wire:
                _copy_flow_fields(wire)
        else:
            wire = _WIRE_TEMPLATE.copy()
            wire["dependsOn"] = []
            wire["childrenIds"] = []
            wire["tags"] = []
        self._put_hot(wire)
        wire["timeline"] = timeline_view(self.timeline)
        return wire

    def wire_hot(self) -> list[Any]:
        """What `to_wire` sets for a job without options, beyond `WIRE_TEMPLATE`'s values: a
        flat [key, value, ...] list, in the template's order (`WIRE_HOT_KEYS`). An encoder
        can pack the rest of a wire map once for every such job. The timeline is the job's
        own tuple, not its wire form (`timeline_view`): it never changes in place, and jobs
        moved together share it, so an encoder can pack it once for all of them."""
        return [
            "id", self.id,
            "queue", self.queue,
            "name", self.name,
            "data", self.data,
            "priority", self.priority,
            "createdAt", self.created_at,
            "runAt", self.run_at,
            "startedAt", self.started_at,
            "completedAt", self.completed_at,
            "attempts", self.attempts,
            "maxAttempts", self.max_attempts,
            "progress", self.progress,
            "progressMessage", self.progress_message,
            "stacktrace", self.stacktrace,
            "lastHeartbeat", self.last_heartbeat,
            "stallCount", self.stall_count,
            "childrenCompleted", self.children_completed,
            "lifo", self.lifo,
            "timeline", self.timeline,
        ]  # fmt: skip

    def _put_hot(self, out: dict[str, Any]) -> None:
        """Store the hot fields into `out`, in `_HOT` order."""
        out["id"] = self.id
        out["queue"] = self.queue
        out["name"] = self.name
        out["data"] = self.data
        out["priority"] = self.priority
        out["createdAt"] = self.created_at
        out["runAt"] = self.run_at
        out["startedAt"] = self.started_at
        out["completedAt"] = self.completed_at
        out["attempts"] = self.attempts
        out["maxAttempts"] = self.max_attempts
        out["progress"] = self.progress
        out["progressMessage"] = self.progress_message
        out["stacktrace"] = self.stacktrace
        out["lastHeartbeat"] = self.last_heartbeat
        out["stallCount"] = self.stall_count
        out["childrenCompleted"] = self.children_completed
        out["lifo"] = self.lifo

    def to_record(self) -> dict[str, Any]:
        """The persisted record: the wire map plus the engine fields (see `_mutations`).

        Options left at their defaults are not stored; `to_wire` fills them back in. Nor are
        the fields holding their default (`_record`): a reader fills them back in.
        """
        rec = dict(self.opts) if self.opts else dict(RECORD_TEMPLATE)
        self._put_hot(rec)
        rec["timeline"] = list(self.timeline)
        rec["state"] = self.state
        rec["seq"] = self.seq
        rec["failedReason"] = self.failed_reason
        rec["dlq"] = self.dlq
        rec["dlqRetries"] = self.dlq_retries
        # Copies: the log and the flow maps change in place later (`delta` mutations), and
        # this record may wait unsent in the same turn.
        rec["logs"] = None if self.logs is None else list(self.logs)
        rec["logsAdded"] = self.logs_added
        if self.opts and "flowPending" in self.opts:
            _copy_flow_fields(rec)
        rec["dedupUntil"] = self.dedup_until
        rec["hasResult"] = self.has_result
        if self.has_result:
            rec["returnvalue"] = self.result
        if self.key != self.id:
            rec["rowKey"] = self.key
        return drop_defaults(rec)

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Job:
        # A decoded record holds its own copy of every string and number: the queue, state
        # and name are shared (interned), and equal timestamps share one object, as a pushed
        # job's do. A restart loads the hot jobs this way: some 200 bytes less each.
        job = cls.from_record_lean(rec)
        job.load_times(rec)
        job.data = rec.get("data")
        job.stacktrace = rec.get("stacktrace")
        job.timeline = tuple([_timeline_entry(e) for e in rec.get("timeline") or ()])
        job.logs = rec.get("logs")
        if job.has_result:
            job.result = rec.get("returnvalue")
        return job

    @classmethod
    def from_record_lean(cls, rec: Mapping[str, Any]) -> Job:
        """`from_record` but for the fields a packed completed job holds in its blob
        (`_packed`), which keep their defaults; `load_times` reads its three times."""
        job = cls(rec["id"], _shared(rec["queue"]), int(rec["seq"]))
        job.name = _shared(rec.get("name") or "default")
        job.priority = rec.get("priority") or 0
        job.created_at = rec.get("createdAt") or 0
        job.completed_at = rec.get("completedAt")
        job.attempts = rec.get("attempts") or 0
        job.max_attempts = rec.get("maxAttempts") or DEFAULT_MAX_ATTEMPTS
        job.progress = rec.get("progress") or 0
        job.progress_message = rec.get("progressMessage")
        job.stall_count = rec.get("stallCount") or 0
        job.children_completed = rec.get("childrenCompleted") or 0
        job.lifo = bool(rec.get("lifo"))
        job.state = _shared(rec["state"])
        job.failed_reason = rec.get("failedReason")
        job.dlq = rec.get("dlq")
        job.dlq_retries = rec.get("dlqRetries") or 0
        job.key = rec.get("rowKey") or job.id
        job.logs_added = rec.get("logsAdded") or len(rec.get("logs") or ())
        job.dedup_until = rec.get("dedupUntil")
        job.has_result = bool(rec.get("hasResult", "returnvalue" in rec))
        # Most records carry no option: one set difference tells, not a test per key.
        if rec.keys() - _NOT_OPTIONS:
            job.opts = {k: v for k, v in rec.items() if k not in _NOT_OPTIONS}
        if "flowPending" in job.opts:
            # In memory an ordered set: a child's result removes its id in O(1).
            opts: dict[str, Any] = job.opts  # type: ignore[assignment]
            opts["flowPending"] = dict.fromkeys(opts["flowPending"] or ())
        return job

    def load_times(self, rec: Mapping[str, Any]) -> None:
        created = self.created_at  # equal times share one object, as a pushed job's do
        run_at = rec.get("runAt") or 0
        self.run_at = created if run_at == created else run_at
        self.started_at = rec.get("startedAt")
        beat = rec.get("lastHeartbeat") or created
        self.last_heartbeat = created if beat == created else beat

    # -- small behaviours -----------------------------------------------------------------

    def public_state(self) -> str:
        if self.state == WAITING and self.priority > 0:
            return "prioritized"
        return self.state


_FLOW_FIELDS: Final = ("childrenValues", "failedChildren", "ignoredFailures")


def _copy_flow_fields(out: dict[str, Any]) -> None:
    """A parent's flow fields in `out` (a record or wire map made from its options) as
    copies of their own, `flowPending` as the list it is stored as."""
    out["flowPending"] = list(out["flowPending"] or ())
    for name in _FLOW_FIELDS:
        value = out.get(name)
        if isinstance(value, dict):
            out[name] = dict(value)


def wire_maps(jobs: list[Job]) -> list[dict[str, Any]]:
    """The jobs' wire maps (`Job.to_wire`), as PULLB answers them by default."""
    return [job.to_wire() for job in jobs]


def timeline_view(timeline: Iterable[tuple[str, int, int | None]]) -> list[dict[str, Any]]:
    """The wire form of a timeline: `[{state, timestamp, attempt?}]`."""
    return [
        {"state": state, "timestamp": timestamp}
        if attempt is None
        else {"state": state, "timestamp": timestamp, "attempt": attempt}
        for state, timestamp, attempt in timeline
    ]


def _shared(text: Any) -> Any:
    """`text`, interned if it is a string (a queue, state or job name read back)."""
    return sys.intern(text) if type(text) is str else text


def _timeline_entry(entry: Any) -> tuple[str, int, int | None]:
    if isinstance(entry, Mapping):
        return (entry["state"], entry["timestamp"], entry.get("attempt"))
    state, timestamp, attempt = entry
    return (state, timestamp, attempt)


def payload_only(fields: Mapping[str, Any]) -> bool:
    """Whether a push's fields are `{"data": ...}`, perhaps with a `name` and `"durable":
    true` (a bulk push without options, durable or not: bunqueue-client's `add_bulk` sends
    data and durable, shardq's the name too): its job is its payload, its name and the
    defaults, `durable` kept in `opts` as `_options` keeps it. Nothing else is checked of
    such a push than its data and name (`durable` true is a valid flag)."""
    size = len(fields)
    if size == 1 or "data" not in fields:
        return size == 1 and "data" in fields
    return size - 1 == ("name" in fields) + (fields.get("durable") is True)


def _number(value: object, default: float) -> float:
    if is_number(value) and math.isfinite(value):
        return int(value) if value == int(value) else value
    return default


def _legacy_name(data: dict[str, Any]) -> str:
    # v2 clients (bunqueue-client 0.1.5) keep the name inside data; data stays verbatim.
    name = data.get("name")
    return name if isinstance(name, str) and name else "default"


def _options(fields: Mapping[str, Any], custom_id: str | None) -> Mapping[str, Any]:
    """Only the options the push set: defaults are filled in by `to_wire`, not stored."""
    opts: dict[str, Any] = {}
    if custom_id is not None:
        opts["customId"] = custom_id
    present = _OPTION_KEYS.intersection(fields) if len(fields) > 1 else ()
    for key in present:
        value = fields[key]
        if value is None:
            continue
        if key in _BOOL_SET:
            opts[key] = bool(value)
        elif key in _LIST_SET:
            opts[key] = [str(v) for v in value]
        elif key == "backoff":
            _set_backoff(opts, value)
        elif key == "dedup":
            _set_dedup(opts, value)
        elif key == "stackTraceLimit":
            opts[key] = as_int(value, DEFAULT_STACK_TRACE_LIMIT)
        else:
            opts[key] = value
    return opts or NO_OPTIONS


def _set_backoff(opts: dict[str, Any], backoff: Any) -> None:
    if isinstance(backoff, Mapping):
        config = {"type": backoff["type"], "delay": _number(backoff["delay"], 0)}
        if backoff.get("maxDelay") is not None:
            config["maxDelay"] = _number(backoff["maxDelay"], DEFAULT_MAX_BACKOFF_MS)
        opts["backoff"] = config["delay"]
        opts["backoffConfig"] = config
    else:
        opts["backoff"] = _number(backoff, DEFAULT_BACKOFF_MS)


def _set_dedup(opts: dict[str, Any], dedup: Any) -> None:
    if isinstance(dedup, Mapping):
        opts["deduplicationTtl"] = dedup.get("ttl")
        opts["deduplicationExtend"] = bool(dedup.get("extend", False))
        opts["deduplicationReplace"] = bool(dedup.get("replace", False))


def backoff_delay(job: Job, rng: random.Random) -> int:
    """Retry delay after `job.attempts` was incremented (bunqueue `calculateBackoff`).

    Exponential (and a plain number): base * 2^attempts * (0.5 + rand). Fixed: delay * (0.8 +
    rand * 0.4). Both capped at backoffConfig.maxDelay, else one hour.
    """
    config = job.opts.get("backoffConfig")
    cap = DEFAULT_MAX_BACKOFF_MS
    if isinstance(config, Mapping):
        cap = config.get("maxDelay", cap)
        if config.get("type") == "fixed":
            return int(min(config["delay"] * (0.8 + rng.random() * 0.4), cap))
        base = config["delay"]
    else:
        base = job.opts.get("backoff", DEFAULT_BACKOFF_MS)
    # Exponent capped so a huge attempt count cannot overflow a float before the cap applies.
    delay = base * (2.0 ** min(job.attempts, 60)) * (0.5 + rng.random())
    return int(min(delay, cap))
