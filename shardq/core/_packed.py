"""Completed jobs kept as a packed record instead of a graph of Python objects.

The engine keeps the newest `max_completed` (50,000) completed jobs in memory so that GetJob,
GetState, GetResult and GetJobs answer for them. As plain `Job`s they cost about 1.2 KB each
(measured: 50,000 of `{"i": n}` hold 49 MB): the slots object, and beside it the payload's
dict, the return value, the timeline (a tuple of tuples), the delivery token, the logs and
stacktrace, each a separate object the allocator and the garbage collector see.

`pack_completed` turns a completed job into a `PackedJob` in place: the same object, its class
switched (a subclass with the same slots), those six bulky fields encoded into one msgpack
blob held in the `data` slot and their own slots emptied. Every other field stays a plain
slot, so the engine's bookkeeping (retention, trimming, counts, lookups by id) reads them as
before. Reading or writing any packed field through the object decodes the blob, puts the
values back and switches the class back to `Job`: a command that reads a completed job
(GetJob, GetResult, GetJobs ...) sees exactly what it would have seen, and a later release
packs it again. A job whose fields would not come back equal from msgpack (a tuple, an int
past 64 bits, a type msgpack does not know) is left as it is: the pack is checked by
decoding it once. So is one whose record is long (`MAX_RECORD_BYTES`, below).

Three of the job's times go into the blob too: `run_at`, `started_at` and `last_heartbeat`,
each a 32-byte int object of its own in a reloaded job (epoch milliseconds are past the
small ints CPython shares), read by nothing that walks the completed jobs (`created_at`,
which GetJobs sorts by and Clean's grace reads, and `completed_at` and `seq`, which the
retention orders by, stay slots). They and the timeline's timestamps are stored as offsets
from one base, a few bytes each instead of nine, and the timeline's states as their index in
`STATES`: a reloaded completed job holds about 100 bytes less (bench/results/
2026-12-05-s10-done-window.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core._job import Job
from shardq.core._lifecycle import COMPLETED, STATES

__all__ = ["PackedJob", "drop_result", "from_record", "pack_completed", "pack_job", "pack_with"]

# The packed fields, in blob order. `timeline` is a tuple of tuples, decoded as such.
_LISTS: Final = ("data", "result", "logs", "stacktrace", "token")
# Times stored as offsets from the blob's base (an int, or None).
_TIMES: Final = ("run_at", "started_at", "last_heartbeat")
_FIELDS: Final = (*_LISTS, *_TIMES, "timeline")
# A timeline entry's state as one byte: its index here (an unknown one stays a string).
_CODE: Final[Mapping[str, int]] = {state: i for i, state in enumerate(STATES)}
# The slots' own descriptors on `Job`: they read and write the storage under the properties.
_SLOT: Final[Mapping[str, Any]] = {name: getattr(Job, name) for name in _FIELDS}
_DATA: Final = _SLOT["data"]
_packer = msgpack.Packer(use_bin_type=True)
# Records longer than this stay unpacked: with its header a `bytes` past 512 bytes leaves
# CPython's small-object allocator for the C heap, so packing would take new heap while the
# blocks it frees stay in the allocator's arenas (measured: a shard of 40,000 completed jobs
# with 400-byte payloads grew by 11 MB when they were packed). Such a job's fields are few,
# large objects anyway; the many small ones are what packing saves.
MAX_RECORD_BYTES: Final = 512 - 33


def _decode(blob: bytes) -> tuple[list[Any], list[int | None], Any]:
    """The packed fields' values from `blob`: the lists', the times', the timeline."""
    values, base, times, flat = msgpack.unpackb(
        blob, raw=False, strict_map_key=False, use_list=True
    )
    return values, [None if t is None else base + t for t in times], _timeline(base, flat)


def _timeline(base: int, flat: list[Any]) -> Any:
    return tuple(
        (STATES[flat[i]] if type(flat[i]) is int else flat[i], base + flat[i + 1], flat[i + 2])
        for i in range(0, len(flat), 3)
    )


def _unpack(job: Job) -> None:
    """Decode a `PackedJob`'s blob back into its slots; it is a plain `Job` after."""
    values, times, timeline = _decode(_DATA.__get__(job, Job))
    job.__class__ = Job
    for name, value in zip(_LISTS, values, strict=True):
        _SLOT[name].__set__(job, value)
    for name, value in zip(_TIMES, times, strict=True):
        _SLOT[name].__set__(job, value)
    job.timeline = timeline


def _field(name: str) -> Any:
    slot = _SLOT[name]

    def get(job: Job) -> Any:
        _unpack(job)
        return slot.__get__(job, Job)

    def put(job: Job, value: Any) -> None:
        _unpack(job)
        slot.__set__(job, value)

    return property(get, put, doc=f"`Job.{name}`, decoded from the packed record on use.")


class PackedJob(Job):
    """A completed `Job` whose bulky fields are one packed record (see above)."""

    __slots__ = ()

    data = _field("data")
    result = _field("result")
    logs = _field("logs")
    stacktrace = _field("stacktrace")
    token = _field("token")
    run_at = _field("run_at")
    started_at = _field("started_at")
    last_heartbeat = _field("last_heartbeat")
    timeline = _field("timeline")


def _offsets(times: list[Any], timeline: Any) -> tuple[int, list[Any], list[Any]] | None:
    """The base, the times and the timeline flattened as offsets from it (see above); None
    if a time is not an int (or None, for a time) or an entry not a triple."""
    if any(t is not None and type(t) is not int for t in times):
        return None
    base = next((t for t in times if t is not None), 0)
    flat: list[Any] = []
    for entry in timeline:
        if type(entry) is not tuple or len(entry) != 3 or type(entry[1]) is not int:
            return None
        state, at, attempt = entry
        flat += (_CODE.get(state, state), at - base, attempt)
    return base, [None if t is None else t - base for t in times], flat


def _pack(job: Job) -> bytes | None:
    """The blob for `job`'s packed fields, or None if they would not decode equal."""
    values = [_SLOT[name].__get__(job, Job) for name in _LISTS]
    times = [_SLOT[name].__get__(job, Job) for name in _TIMES]
    timeline = job.timeline
    offsets = _offsets(times, timeline)
    if offsets is None:
        return None
    try:
        blob: bytes = _packer.pack([values, *offsets])
    except (TypeError, ValueError, OverflowError):
        _packer.reset()
        return None
    if len(blob) > MAX_RECORD_BYTES:
        return None
    back, back_times, back_timeline = _decode(blob)
    if back != values or back_times != times or back_timeline != timeline:
        return None
    return blob


def from_record(rec: Mapping[str, Any]) -> tuple[Job, bytes | None]:
    """`Job.from_record(rec)` and, for a completed job whose fields pack, its blob, which
    `pack_with` puts in once the job is entered (the store's entry reads its times).

    The blob is made from the record's values, as `_pack` would make it from the job
    `Job.from_record` builds, and checked the same way (decoded, compared), without the
    job's payload, result, logs and timeline ever being set: only its times are, so
    entering it reads them. Any record this does not take the short way (another state, a
    timeline entry that is not a list of a state name, an int time and an attempt, a
    value that does not pack or come back equal) gets `Job.from_record` and None."""
    if rec.get("state") != COMPLETED:
        return Job.from_record(rec), None
    job = Job.from_record_lean(rec)
    job.load_times(rec)
    blob = _pack_record(rec, job)
    if blob is None:
        return Job.from_record(rec), None
    return job, blob


def _pack_record(rec: Mapping[str, Any], job: Job) -> bytes | None:
    """The blob `_pack` makes for the job `Job.from_record(rec)` (whose times `job` holds),
    or None where `_pack` gives None or this cannot tell it would not."""
    run_at, started, beat = times = [job.run_at, job.started_at, job.last_heartbeat]
    if type(run_at) is not int or (started is not None and type(started) is not int):
        return None
    if beat is not None and type(beat) is not int:
        return None
    base = run_at  # the first time that is not None, as `_offsets` takes it
    flat: list[Any] = []
    for entry in rec.get("timeline") or ():
        # A state that is not a string could decode as another value (an int is an index).
        if (type(entry) is not list and type(entry) is not tuple) or len(entry) != 3:
            return None
        state, at, attempt = entry
        if type(state) is not str or type(at) is not int:
            return None
        flat += (_CODE.get(state, state), at - base, attempt)
    result = rec.get("returnvalue") if job.has_result else None
    values = [rec.get("data"), result, rec.get("logs"), rec.get("stacktrace"), None]
    record = [values, base, [None if t is None else t - base for t in times], flat]
    try:
        blob: bytes = _packer.pack(record)
    except (TypeError, ValueError, OverflowError):
        _packer.reset()
        return None
    if len(blob) > MAX_RECORD_BYTES:
        return None
    # What `_pack` checks: the values, the times and the timeline come back equal. The times
    # are ints, so each equals its offset's sum with the base exactly when the offsets are
    # equal; the states are strings, so each decodes to itself or from its code.
    back = msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True)
    return blob if back == record else None


def pack_with(job: Job, blob: bytes) -> None:
    """Pack `job`, made by `from_record` with `blob`, in place (as `pack_job` would)."""
    for name in _TIMES:
        _SLOT[name].__set__(job, None)
    _DATA.__set__(job, blob)
    job.__class__ = PackedJob


def pack_job(job: Job) -> bool:
    """Pack `job` in place if it is a plain completed `Job` whose fields pack (see above);
    whether it was packed."""
    if type(job) is not Job or job.state != COMPLETED:
        return False
    blob = _pack(job)
    if blob is None:
        return False
    for name in (*_LISTS, *_TIMES):
        _SLOT[name].__set__(job, None)
    _SLOT["timeline"].__set__(job, ())
    _DATA.__set__(job, blob)
    job.__class__ = PackedJob
    return True


def pack_completed(jobs: Mapping[str, Job], ids: Iterable[str]) -> int:
    """Pack the completed jobs among `ids` (looked up in `jobs`) that are not packed yet;
    how many were packed."""
    packed = 0
    for job_id in ids:
        job = jobs.get(job_id)
        if job is not None and pack_job(job):
            packed += 1
    return packed


def drop_result(job: Job) -> None:
    """Forget `job`'s return value (the results kept are bounded, `_tables`); a packed job
    stays packed (it is decoded, changed and packed again)."""
    packed = type(job) is PackedJob
    job.result, job.has_result = None, False
    if packed:
        pack_job(job)
