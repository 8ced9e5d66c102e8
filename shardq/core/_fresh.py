"""A new job's record made together with its msgpack encoding, at admission.

Every admitted job is put with its whole record (`Job.to_record`), and a shard encodes that
record for its writer (`shardq.storage._encode`): a dozen keys and values packed one by one
(the fields at their default are left out, `_record`), the largest single cost of a pushed job
in the shard. Yet a job just made by `Job.create` without
options differs from the next one in only a few of them: its id, data and seq (and its name
and queue); its times, state and timeline are shared with the jobs admitted with it, and the
fields of its later life (attempts, progress, logs, result ...) all hold their defaults.

`FreshRecords.record` builds such a job's record as `to_record` would (the same keys in the
same order, the same values) as a `PackedRecord`: a dict that also holds its encoding, made by
joining the bytes of the three fields that differ to the encoded runs of fields between them
(`_join`).
Those runs are remembered from one job to the next (the last one of each, so nothing grows),
and encoded again only when a job's shared fields differ from the previous job's.

A job whose only option is `durable` (what bunqueue-client's `add_bulk` sends with each entry
of a durable bulk push) has the same record with `"durable": true` in front, as `to_record`
puts its options first: `record(job, durable=True)` makes that one, one key more, the same way.

The encoder uses `packed` in place of packing the record while the record still has the keys
it was made with (`PackedRecord.made_keys`): the only
change the engine makes to a put's record after emitting it is adding `cold`
(`ColdHead._evict`), which adds a key. Anything that would change a value must make a new
record (`to_record`) instead, as every path does today.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from ._job import Job
from ._lifecycle import WAITING
from ._mutations import Mutation
from ._record import DEFAULT_MAX_ATTEMPTS

__all__ = ["DURABLE_ONLY", "FreshRecords", "PackedRecord"]


DURABLE_ONLY: Final = {"durable": True}
"""The options of a job pushed with `durable` alone (compared with `==`, never handed out)."""


class PackedRecord(dict[str, Any]):
    """A job record and `packed`, its msgpack encoding (`use_bin_type=True`) as made, with
    `made_keys` keys (the encoder uses `packed` only while the record has no other), and
    `putb`, the writer's form of its `put` (`shardq.storage._encode`) as made: made here from
    the values the record was just made of, it spares the encoder a record's six lookups and
    its checks per job. None when a column field is not of the type the writer requires: the
    encoder then leaves the `put` as it is, as it leaves any such record."""

    __slots__ = ("made_keys", "packed", "putb")

    made_keys: int
    packed: bytes
    putb: tuple[Any, ...] | None


# The fields between data and seq, in record order, that a fresh job may hold other than at
# their default: shared by the jobs admitted together. The others (`startedAt`, `attempts`,
# ..., and all after seq) hold their default, which a record leaves out (`_record`).
_MIDDLE: Final = (
    "priority", "createdAt", "runAt", "maxAttempts", "lastHeartbeat", "lifo", "timeline", "state"
)  # fmt: skip


def _run(pairs: list[tuple[str, Any]]) -> bytes:
    """The msgpack of `pairs` as a map's entries, without the map's header."""
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    for key, value in pairs:
        packer.pack(key)
        packer.pack(value)
    return bytes(packer.bytes())


# By whether the job is durable and by its record's number of keys (a fresh record has at
# most 14, a fixmap's header is one byte): the map's header and the entries before the id's
# value (`"durable": true` first for a durable job, as `to_record` puts options first).
_HEADS: Final = tuple(
    tuple(bytes((0x80 | n,)) + prefix + msgpack.packb("id") for n in range(16))
    for prefix in (b"", _run([("durable", True)]))
)
_DATA_KEY: Final = msgpack.packb("data")
_SEQ_KEY: Final = msgpack.packb("seq")


def _join(head: bytes, pack: Callable[[Any], bytes], job_id: str, named: bytes, data: Any,
          middle: bytes, seq: int) -> bytes:  # fmt: skip
    """A fresh record's bytes: its header, its own id, data and seq, the runs between."""
    return b"".join((head, pack(job_id), named, pack(data), middle, pack(seq)))


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
        with `durable` its one option (`DURABLE_ONLY`). Fields at their default are left
        out as `to_record` leaves them out (`_record.drop_defaults`)."""
        rec = PackedRecord(DURABLE_ONLY) if durable else PackedRecord()
        rec["id"] = job.id
        rec["queue"] = job.queue
        if job.name != "default":
            rec["name"] = job.name
        rec["data"] = job.data
        # Only exactly the default is left out: 0.0 is not 0, which packs differently.
        priority, attempts, lifo = job.priority, job.max_attempts, job.lifo
        if priority != 0 or type(priority) is not int:
            rec["priority"] = priority
        rec["createdAt"] = job.created_at
        rec["runAt"] = job.run_at
        if attempts != DEFAULT_MAX_ATTEMPTS or type(attempts) is not int:
            rec["maxAttempts"] = attempts
        rec["lastHeartbeat"] = job.last_heartbeat
        if lifo is not False:
            rec["lifo"] = lifo
        if job.timeline:
            rec["timeline"] = list(job.timeline)
        rec["state"] = job.state
        rec["seq"] = job.seq
        rec.made_keys = len(rec)
        try:
            rec.packed = packed = self._encode(job, rec, _HEADS[durable][len(rec)])
        except (TypeError, ValueError, OverflowError):
            # A value msgpack cannot take: the plain record, for the encoder to report as it
            # reports any other (`shardq.runtime.shard._writer_batches`).
            return dict(rec)
        key, queue, state, seq = job.id, job.queue, job.state, job.seq
        if type(key) is str and type(queue) is str and type(state) is str and type(seq) is int:
            # The priority as the encoder reads it: absent at its default (`_record`).
            rec.putb = ("putb", key, queue, state, rec.get("priority", 0), job.run_at, seq, packed)
        else:
            rec.putb = None
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
        head = named = middle = b""  # `last`'s header, and the runs `record` left for it
        pack = self._pack
        join = b"".join
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
                if type(rec) is PackedRecord:
                    last, prev, head = rec, job, _HEADS[durable][len(rec)]
                    named, middle = self._named, self._middle
                else:
                    last, prev = None, None
                continue
            # A copy of `last`: its timeline list too, the same tuple's (records are read-only,
            # as the payloads jobs moved together share, `JobStore.move_run`).
            rec = PackedRecord(last)
            rec["id"] = job_id = job.id
            rec["data"] = data = job.data
            rec["seq"] = seq = job.seq
            rec.made_keys = last.made_keys
            try:  # `_join`, inline
                rec.packed = packed = join(
                    (head, pack(job_id), named, pack(data), middle, pack(seq))
                )
            except (TypeError, ValueError, OverflowError):
                out.append(("put", dict(rec)))  # as `record` gives it; `last` stays the run's
                continue
            # `record`'s `putb`: `last`'s columns (the same values), this job's key and seq.
            putb = last.putb
            if putb is not None and type(job_id) is str and type(seq) is int:
                putb = ("putb", job_id, putb[2], putb[3], putb[4], putb[5], seq, packed)
            else:
                putb = None
            rec.putb = putb
            out.append(("put", rec))
            prev = job

    def payload_jobs(
        self, ids: list[str], queue: str, seq: int, entries: list[Mapping[str, Any]], now: int
    ) -> tuple[list[Job], list[Mutation]]:
        """The jobs of a payload-only PUSHB's entries (all of one shape: `{"data": ...}`, with
        a `name` and/or `"durable": true`; `_produce._data_only`), `ids[i]` and sequence
        number `seq + 1 + i` each, waiting with the one timeline all of them get when
        admitted (`JobStore.admit_waiting`); and their `put`s, in order: what
        `Job.create_plain` of each and then `put_all` of them make, in one pass.

        Such jobs share every field a record holds but their id, data, seq and name (their
        queue, times, defaults, timeline and state are the very same objects), so a job named
        as the one before it gets a copy of that job's record (`put_all`'s copy) without the
        comparisons `put_all` makes to know it."""
        jobs: list[Job] = []
        append = jobs.append
        puts: list[Mutation] = []
        put = puts.append
        first = entries[0] if entries else {}
        named, durable = "name" in first, "durable" in first
        timeline = ((WAITING, now, None),)
        last: PackedRecord | None = None  # the previous job's record, while a copy may follow
        last_name = ""
        head = named_run = middle = b""  # `last`'s header, and the runs `record` left for it
        pack = self._pack
        join = b"".join
        for job_id, entry in zip(ids, entries, strict=True):
            seq += 1
            job = Job(job_id, queue, seq)
            job.timeline = timeline
            job.data = data = entry["data"]
            # The given name, else the data's (`_job._legacy_name`, inline), else the default.
            name = entry["name"] if named else None
            if not (named and isinstance(name, str) and name) and type(data) is dict:
                name = data.get("name")
            if name is not None and isinstance(name, str) and name:  # most data has no name
                job.name = name
            job.created_at = job.last_heartbeat = job.run_at = now
            if durable:
                job.opts = {"durable": True}  # as `_options` has it; each job its own
            append(job)
            if last is None or job.name != last_name:
                rec = self.record(job, durable)
                put(("put", rec))
                if type(rec) is PackedRecord:
                    last, last_name, head = rec, job.name, _HEADS[durable][len(rec)]
                    named_run, middle = self._named, self._middle
                else:
                    last = None
                continue
            rec = PackedRecord(last)  # `put_all`'s copy
            rec["id"] = job_id
            rec["data"] = data
            rec["seq"] = seq
            rec.made_keys = last.made_keys
            try:
                rec.packed = packed = join(
                    (head, pack(job_id), named_run, pack(data), middle, pack(seq))
                )
            except (TypeError, ValueError, OverflowError):
                put(("put", dict(rec)))  # as `record` gives it; `last` stays the run's
                continue
            # `put_all`'s `putb`: the ids are the id factory's strings.
            putb = last.putb
            rec.putb = (
                ("putb", job_id, putb[2], putb[3], putb[4], putb[5], seq, packed)
                if putb is not None
                else None
            )
            put(("put", rec))
        return jobs, puts

    def _encode(self, job: Job, rec: PackedRecord, head: bytes) -> bytes:
        """`rec`'s msgpack (`rec` was just made from `job`; `head` its map's header and the
        keys before the id's value)."""
        queue, name = job.queue, job.name
        named = self._named_of
        if named is None or named[0] != queue or named[1] != name:
            # The bytes before their key: a failed encoding leaves both as they were.
            pairs = [("queue", queue)] if name == "default" else [("queue", queue), ("name", name)]
            self._named = _run(pairs) + _DATA_KEY
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
            self._middle = _run([(key, rec[key]) for key in _MIDDLE if key in rec]) + _SEQ_KEY
            self._middle_of = (job.timeline, created, run_at, beat, priority, attempts, lifo, state)
        return _join(head, self._pack, job.id, self._named, job.data, self._middle, job.seq)
