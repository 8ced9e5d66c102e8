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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core._job import Job
from shardq.core._lifecycle import COMPLETED

__all__ = ["PackedJob", "drop_result", "pack_completed", "pack_job"]

# The packed fields, in blob order. `timeline` is a tuple of tuples, decoded as such.
_LISTS: Final = ("data", "result", "logs", "stacktrace", "token")
_FIELDS: Final = (*_LISTS, "timeline")
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


def _unpack(job: Job) -> None:
    """Decode a `PackedJob`'s blob back into its slots; it is a plain `Job` after."""
    values, timeline = msgpack.unpackb(
        _DATA.__get__(job, Job), raw=False, strict_map_key=False, use_list=True
    )
    job.__class__ = Job
    for name, value in zip(_LISTS, values, strict=True):
        _SLOT[name].__set__(job, value)
    job.timeline = tuple(tuple(entry) for entry in timeline)


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
    timeline = _field("timeline")


def _pack(job: Job) -> bytes | None:
    """The blob for `job`'s packed fields, or None if they would not decode equal."""
    values = [_SLOT[name].__get__(job, Job) for name in _LISTS]
    timeline = job.timeline
    try:
        blob: bytes = _packer.pack([values, timeline])
    except (TypeError, ValueError, OverflowError):
        _packer.reset()
        return None
    if len(blob) > MAX_RECORD_BYTES:
        return None
    back, back_timeline = msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True)
    if back != values or tuple(tuple(e) for e in back_timeline) != timeline:
        return None
    return blob


def pack_job(job: Job) -> bool:
    """Pack `job` in place if it is a plain completed `Job` whose fields pack (see above);
    whether it was packed."""
    if type(job) is not Job or job.state != COMPLETED:
        return False
    blob = _pack(job)
    if blob is None:
        return False
    for name in _LISTS:
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
