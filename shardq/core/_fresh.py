"""A new job's record made together with its msgpack encoding, at admission.

Every admitted job is put with its whole record (`Job.to_record`), and a shard encodes that
record for its writer (`shardq.storage._encode`): 28 keys and values packed one by one, the
largest single cost of a pushed job in the shard. Yet a job just made by `Job.create` without
options differs from the next one in only a few of them: its id, data and seq (and its name
and queue); its times, state and timeline are shared with the jobs admitted with it, and the
fields of its later life (attempts, progress, logs, result ...) all hold their defaults.

`FreshRecords.record` builds such a job's record as `to_record` would (the same keys in the
same order, the same values) as a `PackedRecord`: a dict that also holds its encoding, made by
joining the bytes of the three fields that differ to the encoded runs of fields between them.
Those runs are remembered from one job to the next (the last one of each, so nothing grows),
and encoded again only when a job's shared fields differ from the previous job's.

A job whose only option is `durable` (what bunqueue-client's `add_bulk` sends with each entry
of a durable bulk push) has the same record with `"durable": true` in front, as `to_record`
puts its options first: `record(job, durable=True)` makes that one, one key more, the same way.

The encoder uses `packed` in place of packing the record while the record still has the keys
it was made with (`PackedRecord.made_keys`: `FRESH_KEYS`, one more when durable): the only
change the engine makes to a put's record after emitting it is adding `cold`
(`ColdHead._evict`), which adds a key. Anything that would change a value must make a new
record (`to_record`) instead, as every path does today.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from ._job import _RECORD_TEMPLATE, Job
from ._mutations import Mutation

__all__ = ["DURABLE_ONLY", "FRESH_KEYS", "FreshRecords", "PackedRecord"]

FRESH_KEYS: Final = len(_RECORD_TEMPLATE)
"""How many keys a fresh record has (a record of a job without options, result or row key)."""


DURABLE_ONLY: Final = {"durable": True}
"""The options of a job pushed with `durable` alone (compared with `==`, never handed out)."""


class PackedRecord(dict[str, Any]):
    """A job record and `packed`, its msgpack encoding (`use_bin_type=True`) as made, with
    `made_keys` keys (the encoder uses `packed` only while the record has no other)."""

    __slots__ = ("made_keys", "packed")

    made_keys: int
    packed: bytes


# The fields between data and seq, in record order: shared by the jobs admitted together.
_MIDDLE: Final = (
    "priority", "createdAt", "runAt", "startedAt", "completedAt", "attempts", "maxAttempts",
    "progress", "progressMessage", "stacktrace", "lastHeartbeat", "stallCount",
    "childrenCompleted", "lifo", "timeline", "state",
)  # fmt: skip
# The fields after seq: their defaults, for every fresh job.
_TAIL: Final = (
    ("failedReason", None), ("dlq", None), ("dlqRetries", 0), ("logs", None),
    ("logsAdded", 0), ("dedupUntil", None), ("hasResult", False),
)  # fmt: skip
# The record of a fresh job before its own fields are set: the defaults `to_record` writes.
_FRESH_TEMPLATE: Final[dict[str, Any]] = {
    **_RECORD_TEMPLATE,
    "startedAt": None, "completedAt": None, "attempts": 0, "progress": 0,
    "progressMessage": None, "stacktrace": None, "stallCount": 0, "childrenCompleted": 0,
    **dict(_TAIL),
}  # fmt: skip
assert list(_FRESH_TEMPLATE) == list(_RECORD_TEMPLATE), "the record's key order"
assert list(_FRESH_TEMPLATE)[3 : 5 + len(_MIDDLE)] == ["data", *_MIDDLE, "seq"]


def _run(pairs: list[tuple[str, Any]]) -> bytes:
    """The msgpack of `pairs` as a map's entries, without the map's header."""
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    for key, value in pairs:
        packer.pack(key)
        packer.pack(value)
    return bytes(packer.bytes())


# The header of a map of `FRESH_KEYS` entries and the key "id"; the entries after seq. A durable
# job's: one entry more, `"durable": true` first.
_HEAD: Final = b"\xde" + FRESH_KEYS.to_bytes(2, "big") + msgpack.packb("id")
_DURABLE_HEAD: Final = (
    b"\xde" + (FRESH_KEYS + 1).to_bytes(2, "big") + _run([("durable", True), ("id", None)])[:-1]
)
_DURABLE_TEMPLATE: Final[dict[str, Any]] = {**DURABLE_ONLY, **_FRESH_TEMPLATE}
_END: Final = _run(list(_TAIL))
_DATA_KEY: Final = msgpack.packb("data")
_SEQ_KEY: Final = msgpack.packb("seq")


class FreshRecords:
    """Records of fresh jobs with their encoding (one per job store: it remembers the last
    queue and name, and the last shared fields, with their encoded runs)."""

    __slots__ = ("_middle", "_middle_of", "_named", "_named_of", "_pack")

    def __init__(self) -> None:
        self._pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack
        self._named_of: tuple[str, str] | None = None
        self._named = b""
        self._middle_of: tuple[Any, ...] = ()
        self._middle = b""

    def record(self, job: Job, durable: bool = False) -> dict[str, Any]:
        """`job.to_record()` with its encoding, for a job as `Job.create` made it without
        options or a custom id, then placed (its state and timeline set); `durable`: made
        with `durable` its one option (`DURABLE_ONLY`)."""
        rec = PackedRecord(_DURABLE_TEMPLATE if durable else _FRESH_TEMPLATE)
        rec.made_keys = FRESH_KEYS + durable
        rec["id"] = job.id
        rec["queue"] = job.queue
        rec["name"] = job.name
        rec["data"] = job.data
        rec["priority"] = job.priority
        rec["createdAt"] = job.created_at
        rec["runAt"] = job.run_at
        rec["maxAttempts"] = job.max_attempts
        rec["lastHeartbeat"] = job.last_heartbeat
        rec["lifo"] = job.lifo
        rec["timeline"] = list(job.timeline)
        rec["state"] = job.state
        rec["seq"] = job.seq
        try:
            rec.packed = self._encode(job, rec, _DURABLE_HEAD if durable else _HEAD)
        except (TypeError, ValueError, OverflowError):
            # A value msgpack cannot take: the plain record, for the encoder to report as it
            # reports any other (`shardq.runtime.shard._writer_batches`).
            return dict(rec)
        return rec

    def put_all(self, jobs: Iterable[Job], out: list[Mutation]) -> None:
        """Append to `out` a `put` of each job's record, in order: `record`'s for a job
        without options or with `durable` alone, `to_record`'s for any other.

        A fresh job whose shared fields (queue, name, times, defaults, timeline and state) are
        those of the job before it (the jobs of one admission: the very same objects, compared
        by identity as `_encode` compares them) gets a copy of that job's record with its own
        id, data, timeline and seq, and its bytes from the runs that job left: the record and
        the bytes `record` makes, without setting and comparing the shared fields again."""
        last: PackedRecord | None = None  # the previous job's record, made here
        prev: Job | None = None  # the previous job, while `last` is its record
        pack = self._pack
        heads = (_HEAD, _DURABLE_HEAD)
        for job in jobs:
            opts = job.opts
            if opts and opts != DURABLE_ONLY:
                out.append(("put", job.to_record()))
                last, prev = None, None
                continue
            durable = bool(opts)
            if not (  # `job` shares `prev`'s fields (see above), one test each
                last is not None
                and prev is not None
                and job.timeline is prev.timeline
                and job.created_at is prev.created_at
                and job.run_at is prev.run_at
                and job.last_heartbeat is prev.last_heartbeat
                and job.priority is prev.priority
                and job.max_attempts is prev.max_attempts
                and job.lifo is prev.lifo
                and job.state is prev.state
                and job.name == prev.name
                and job.queue == prev.queue
                and bool(prev.opts) is durable
            ):
                rec = self.record(job, durable)
                out.append(("put", rec))
                last, prev = (rec, job) if type(rec) is PackedRecord else (None, None)
                continue
            rec = PackedRecord(last)
            rec["id"] = job_id = job.id
            rec["data"] = data = job.data
            rec["timeline"] = list(job.timeline)
            rec["seq"] = seq = job.seq
            rec.made_keys = last.made_keys
            try:
                rec.packed = b"".join(
                    (heads[durable], pack(job_id), self._named, pack(data), self._middle,
                     pack(seq), _END)
                )  # fmt: skip
            except (TypeError, ValueError, OverflowError):
                out.append(("put", dict(rec)))  # as `record` gives it; `last` stays the run's
                continue
            out.append(("put", rec))
            prev = job

    def _encode(self, job: Job, rec: PackedRecord, head: bytes) -> bytes:
        """`rec`'s msgpack (`rec` was just made from `job`; `head` its map's header and the
        keys before the id's value)."""
        queue, name = rec["queue"], rec["name"]
        named = self._named_of
        if named is None or named[0] != queue or named[1] != name:
            # The bytes before their key: a failed encoding leaves both as they were.
            self._named = _run([("queue", queue), ("name", name)]) + _DATA_KEY
            self._named_of = (queue, name)
        # Compared by identity: the jobs of one admission hold the very same objects, and
        # identity cannot take 0 for 0.0 or False, which pack differently.
        created, run_at, beat = job.created_at, job.run_at, job.last_heartbeat
        priority, attempts, lifo, state = job.priority, job.max_attempts, job.lifo, job.state
        m = self._middle_of
        if not (
            m
            and m[0] is job.timeline
            and m[1] is created
            and m[2] is run_at
            and m[3] is beat
            and m[4] is priority
            and m[5] is attempts
            and m[6] is lifo
            and m[7] is state
        ):
            self._middle = _run([(key, rec[key]) for key in _MIDDLE]) + _SEQ_KEY
            self._middle_of = (job.timeline, created, run_at, beat, priority, attempts, lifo, state)
        pack = self._pack
        return b"".join(
            (head, pack(job.id), self._named, pack(job.data), self._middle, pack(job.seq), _END)
        )

