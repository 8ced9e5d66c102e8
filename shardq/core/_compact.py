"""`CompactJobs`: PULLB's jobs as snapshots a host that packs replies itself can pack fast.

A job's wire map (`Job.to_wire`) is `WIRE_TEMPLATE` with the job's options and its hot fields
(`WIRE_HOT_KEYS`) set. Most of it is the same for many jobs, so an entry is:

- a job without options: its `Job.wire_hot` list;
- a job whose options are only shared settings (`SHARED_OPTIONS`, plain values: the task
  API's `stackTraceLimit`, a queue's `timeout` or `removeOnComplete`): the pair
  (its options as a tuple of items, its `wire_hot` list). Those keys are in the template
  already, so its map is the template with their values replaced, in the same key order: a
  packer packs that head once per distinct set of options (`shard._wire`);
- any other job (a custom id, a unique key, a flow, list options): its full wire map.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Final, TypeAlias

from ._job import _BOOL_OPTS, _WIRE_DEFAULTS, _WIRE_TEMPLATE, Job, timeline_view

__all__ = ["SHARED_OPTIONS", "CompactJobs", "Entry", "OptionItems", "shared_options"]

OptionItems: TypeAlias = tuple[tuple[str, Any], ...]
Entry: TypeAlias = list[Any] | tuple[OptionItems, list[Any]] | dict[str, Any]

_SETTINGS: Final = ("stackTraceLimit", "backoff", "timeout", "ttl", "stallTimeout", "keepLogs",
                     "sizeLimit", "debounceTtl", *_BOOL_OPTS)  # fmt: skip
SHARED_OPTIONS: Final = frozenset(_SETTINGS) & frozenset(_WIRE_DEFAULTS)
"""Options whose values many jobs share (no ids, keys or lists): a job with only these keeps
the compact form."""
_PLAIN: Final = frozenset((int, float, bool))
_OPTIONS_OF: Final = attrgetter("opts")


def shared_options(opts: Any) -> OptionItems | None:
    """A job's options as items when they are all shared settings of plain value, else None."""
    for key, value in opts.items():
        if key not in SHARED_OPTIONS or type(value) not in _PLAIN:
            return None
    return tuple(opts.items())


class CompactJobs:
    """PULLB's jobs in the compact form an engine built with `compact_pulls=True` answers.

    Each entry (module doc) is a snapshot taken when the pull ran. A host that packs replies
    itself (the shard process) packs the template once for every job; `maps()` gives the
    plain wire maps to anyone else.
    """

    __slots__ = ("entries",)

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries

    @classmethod
    def of(cls, jobs: list[Job]) -> CompactJobs:
        if not any(map(_OPTIONS_OF, jobs)):  # the common pull: no job has options
            # `Job.wire_hot` of each, written out: a call per job (from `map` a frame of its
            # own) cost more than building the list (tests/runtime/test_shard_wire.py).
            return cls([
                [
                    "id", j.id, "queue", j.queue, "name", j.name, "data", j.data,
                    "priority", j.priority, "createdAt", j.created_at, "runAt", j.run_at,
                    "startedAt", j.started_at, "completedAt", j.completed_at,
                    "attempts", j.attempts, "maxAttempts", j.max_attempts,
                    "progress", j.progress, "progressMessage", j.progress_message,
                    "stacktrace", j.stacktrace, "lastHeartbeat", j.last_heartbeat,
                    "stallCount", j.stall_count, "childrenCompleted", j.children_completed,
                    "lifo", j.lifo, "timeline", j.timeline,
                ]
                for j in jobs
            ])  # fmt: skip
        entries: list[Entry] = []
        for job in jobs:
            opts = job.opts
            if not opts:
                entries.append(job.wire_hot())
                continue
            shared = shared_options(opts)
            entries.append(job.to_wire() if shared is None else (shared, job.wire_hot()))
        return cls(entries)

    def __len__(self) -> int:
        return len(self.entries)

    def maps(self) -> list[dict[str, Any]]:
        """The wire maps these entries stand for, exactly as `wire_maps` would give them."""
        out: list[dict[str, Any]] = []
        for entry in self.entries:
            if isinstance(entry, dict):
                out.append(entry)
                continue
            wire = _WIRE_TEMPLATE.copy()
            wire["dependsOn"] = []
            wire["childrenIds"] = []
            wire["tags"] = []
            if isinstance(entry, tuple):
                options, entry = entry
                wire.update(options)
            wire.update(zip(entry[::2], entry[1::2], strict=True))
            wire["timeline"] = timeline_view(wire["timeline"])
            out.append(wire)
        return out
