"""The front end's pure helpers: the job-to-shard cache, fan-out verdicts and reply merges.

Nothing here touches a socket; `_dispatch` wires these into the request flow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Any, Final, cast

from shardq.protocol._direct import BATCH_ARRAYS
from shardq.protocol._prepacked import IDS_KEY
from shardq.runtime._sections import FrontendSettings

__all__ = [
    "SHARD_UNAVAILABLE",
    "JobCache",
    "combine_batch",
    "is_found",
    "learned_ids",
    "merge_cron_list",
    "merge_list_queues",
    "merge_stats",
    "shard_unavailable",
    "sub_batch",
]

Reply = dict[str, Any]

# `job_cache_size`'s default (`FrontendSettings` documents it): about 200 bytes an id.
DEFAULT_CACHE_SIZE: Final = FrontendSettings().job_cache_size
DEFAULT_CACHE_BYTES: Final = FrontendSettings().job_cache_max_mb << 20
# What a cached id costs beyond its characters: the ordered dict's slot and node (91 bytes,
# measured with tracemalloc over 100,000 ids) and the string's header (49).
CACHE_ENTRY_BYTES: Final = 144
_IS_STR: Final = str.__instancecheck__


class JobCache:
    """Which shard holds a job id, for commands that carry only the id.

    Bounded in entries (`job_cache_size`) and in bytes (`job_cache_max_mb`, each id counted
    as its length plus `CACHE_ENTRY_BYTES`). Two generations of plain dicts: a reply's ids go
    into the young one in one `dict.update`, without a Python frame per id (this runs for every
    push and pull reply of a front end with several shards, and the ordered dict it replaced,
    one `move_to_end` or insertion per id, was the largest part of the front end's CPU on
    push -> pull -> ack). Once the young one holds half the bound, or both together pass it,
    it becomes the old one and the old one is dropped whole. A lookup asks the young one, then
    the old. So the ids learned longest ago go first (a generation at a time), about the
    newest half of the bound is always kept, and an id learned again (a pull after its push)
    is young again. A miss is never wrong, only slower (the front end then asks every shard),
    so eviction is safe, and so is `clear` when the front end gives memory back after a busy
    period.
    """

    def __init__(
        self, capacity: int = DEFAULT_CACHE_SIZE, max_bytes: int = DEFAULT_CACHE_BYTES
    ) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._young: dict[str, int] = {}
        self._old: dict[str, int] = {}
        self._young_bytes = 0  # the estimate of what each generation's entries take
        self._old_bytes = 0

    def __len__(self) -> int:
        """Entries held: an id in both generations counts twice, as it takes memory twice."""
        return len(self._young) + len(self._old)

    @property
    def bytes(self) -> int:
        """The estimate of what the entries take."""
        return self._young_bytes + self._old_bytes

    def get(self, job_id: object) -> int | None:
        if not isinstance(job_id, str):
            return None
        shard = self._young.get(job_id)
        return shard if shard is not None else self._old.get(job_id)

    def clear(self) -> None:
        """Forget every job: the shards dropped queues (a partition passed to another node),
        or the front end gives memory back (new tables, so the old ones' memory goes)."""
        self._young, self._old = {}, {}
        self._young_bytes = self._old_bytes = 0

    def holder(self, job_ids: Sequence[object]) -> int | None:
        """The one shard that holds every id of `job_ids`, by the cache; None when an id is
        missing, not a string, or the ids lie on several shards (or there are none).

        One lookup per id without a Python frame per id (`map` over the young dict's own
        `get`) when the young generation knows every id, as it does for the usual ACKB (the
        jobs of a PULLB just answered): this runs for every ACKB of a front end with several
        shards."""
        if not job_ids or not all(map(_IS_STR, job_ids)):
            return None
        ids = cast("Sequence[str]", job_ids)
        found: list[int | None] = list(map(self._young.get, ids))
        if None in found:
            if not self._old:
                return None
            found = list(map(self.get, ids))
        first = found[0]
        if first is None or found.count(first) != len(found):
            return None
        return first

    def learn(self, job_ids: Sequence[object], shard: int) -> None:
        """Remember each str id's shard, in the young generation. Ids come decoded from
        msgpack: a non-str one (a broken reply) is only skipped."""
        if self.capacity <= 0 or self.max_bytes <= 0:
            return
        young = self._young
        if len(job_ids) == 1:  # a single push's reply: cheaper without the iterators
            job_id = job_ids[0]
            if not isinstance(job_id, str):
                return
            if job_id not in young:
                self._young_bytes += len(job_id) + CACHE_ENTRY_BYTES
            young[job_id] = shard
        elif not self._learn_many(young, job_ids, shard):
            return
        if (
            len(young) * 2 >= self.capacity
            or self._young_bytes * 2 >= self.max_bytes
            or len(young) + len(self._old) > self.capacity
            or self._young_bytes + self._old_bytes > self.max_bytes
        ):
            self._age()

    def _learn_many(self, young: dict[str, int], job_ids: Sequence[object], shard: int) -> bool:
        """`learn` for a reply of several ids: one `dict.update`; False if none is a str."""
        ids = job_ids if all(map(_IS_STR, job_ids)) else [i for i in job_ids if _IS_STR(i)]
        if not ids:
            return False
        before = len(young)
        young.update(zip(cast("Sequence[str]", ids), repeat(shard)))
        added = len(young) - before
        if added:
            # Exact unless some ids were there already (learned again, or twice in one
            # reply): then the new ones are taken to be of the batch's mean length.
            chars = sum(map(len, cast("Sequence[str]", ids)))
            if added != len(ids):
                chars = chars * added // len(ids)
            self._young_bytes += chars + added * CACHE_ENTRY_BYTES
        return True

    def _age(self) -> None:
        """The young generation becomes the old one, the old one is dropped; an old one over
        the whole bound by itself (one reply with more ids than that) keeps only its newest."""
        old, self._young = self._young, {}
        size, self._young_bytes = self._young_bytes, 0
        if len(old) > self.capacity or size > self.max_bytes:
            kept: list[str] = []
            size = 0
            for job_id in reversed(old):
                cost = len(job_id) + CACHE_ENTRY_BYTES
                if len(kept) >= self.capacity or size + cost > self.max_bytes:
                    break
                kept.append(job_id)
                size += cost
            old = {job_id: old[job_id] for job_id in reversed(kept)}
        self._old, self._old_bytes = old, size


def _job_id(job: object) -> list[object]:
    return [job.get("id")] if isinstance(job, Mapping) else []


def _job_ids(jobs: object) -> list[object]:
    if not isinstance(jobs, list):
        return []
    return [j.get("id") for j in jobs if isinstance(j, Mapping)]


def _ids(ids: object) -> list[object]:
    return list(ids) if isinstance(ids, list) else []


_LEARN: Final[dict[str, Callable[[Reply], list[object]]]] = {
    "PUSH": lambda r: [r.get("id")],
    "PUSHB": lambda r: _ids(r.get("ids")),
    "PUSHF": lambda r: _ids([j.get("id") for j in r.get("data", {}).get("jobs", ())]),
    "PULL": lambda r: _job_id(r.get("job")),
    "PULLB": lambda r: _ids(r[IDS_KEY]) if IDS_KEY in r else _job_ids(r.get("jobs")),
    "GetJob": lambda r: _job_id(r.get("job")),
    "GetJobByCustomId": lambda r: _job_id(r.get("job")),
    "GetJobs": lambda r: _job_ids(r.get("jobs")),
}


def learned_ids(name: str, reply: Reply) -> list[object]:
    """The job ids a successful reply to `name` reveals (empty when it reveals none)."""
    learn = _LEARN.get(name)
    if learn is None or not reply.get("ok"):
        return []
    return learn(reply)


# The answer to a request for a shard that died before replying, or that is restarting. The
# request may or may not have been applied; a client retries it (transient).
SHARD_UNAVAILABLE = "Shard unavailable"


def shard_unavailable(shard: int) -> Reply:
    return {"ok": False, "error": f"{SHARD_UNAVAILABLE}: shard {shard} is restarting"}


_CHILDREN_VALUES: Final = frozenset(
    {"GetChildrenValues", "GetFailedChildrenValues", "GetIgnoredChildrenFailures"}
)


def is_found(name: str, reply: Reply) -> bool:
    """Whether a shard's reply to an id command shows that this shard holds the job.

    An error containing "not found" (bunqueue's contract, docs/protocol.md §13.3) means "not
    here"; any other error came from the shard that holds the job. A few queries answer ok for
    an unknown id, so for them the content decides.
    """
    if not reply.get("ok"):
        error = str(reply.get("error", ""))
        return "not found" not in error.lower() and not error.startswith(SHARD_UNAVAILABLE)
    if name == "GetState":
        return reply.get("state") != "unknown"
    if name == "GetResult":
        return "result" in reply
    if name == "RemoveJobDeduplicationKey":  # an unknown id answers removed: false
        data = reply.get("data")
        return isinstance(data, Mapping) and data.get("removed") is True
    if name in _CHILDREN_VALUES:
        # Every shard answers values for any id (empty when it does not hold the parent).
        data = reply.get("data")
        values = data.get("values") if isinstance(data, Mapping) else reply.get("values")
        return bool(values)
    if name == "GetLogs":
        data = reply.get("data")
        return isinstance(data, Mapping) and bool(data.get("count"))
    return True


def first_error(replies: Sequence[Reply]) -> Reply | None:
    return next((r for r in replies if not r.get("ok")), None)


def merge_list_queues(replies: Sequence[Reply]) -> Reply:
    """ListQueues over every shard: the sorted union of their queue names."""
    error = first_error(replies)
    if error is not None:
        return error
    names: set[str] = set()
    for reply in replies:
        names.update(reply.get("queues") or ())
    return {"ok": True, "queues": sorted(names)}


def merge_cron_list(replies: Sequence[Reply]) -> Reply:
    """CronList over every shard: each shard's schedules, together, ordered by name."""
    error = first_error(replies)
    if error is not None:
        return error
    crons = [c for reply in replies for c in reply.get("crons") or ()]
    crons.sort(key=lambda c: str(c.get("name")))
    return {"ok": True, "crons": crons}


def merge_stats(
    replies: Sequence[Reply], uptime_ms: int, rates: tuple[float, float] = (0.0, 0.0)
) -> Reply:
    """Stats over every shard: counts summed, plus the front end's uptime and its
    (`pushPerSec`, `pullPerSec`) `rates`: every push and pull but the single pushes on the
    shards' direct ports passes through the front end, so it counts them
    (`_metrics.Counters`); the shards add the rate of their direct ones
    (`directPushPerSec`)."""
    error = first_error(replies)
    if error is not None:
        return error
    stats: dict[str, Any] = {}
    for reply in replies:
        for key, value in (reply.get("stats") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                stats[key] = stats.get(key, 0) + value
    direct = stats.pop("directPushPerSec", 0)
    push = round(rates[0] + direct, 2) if direct else rates[0]
    direct_pulls = stats.pop("directPullPerSec", 0)  # handed-off connections' pulls
    pull = round(rates[1] + direct_pulls, 2) if direct_pulls else rates[1]
    stats.update(uptime=uptime_ms, pushPerSec=push, pullPerSec=pull)
    return {"ok": True, "stats": stats}


# -- commands over many job ids ------------------------------------------------------------


def sub_batch(name: str, cmd: Mapping[str, Any], indices: Sequence[int]) -> dict[str, Any]:
    """The part of a batch command for the positions `indices`, arrays sliced alike."""
    sub = dict(cmd)
    sub["ids"] = [cmd["ids"][i] for i in indices]
    for key in BATCH_ARRAYS[name]:
        values = cmd.get(key)
        if isinstance(values, list):
            sub[key] = [values[i] if i < len(values) else None for i in indices]
    return sub


def combine_batch(
    name: str, ids: Sequence[Any], parts: Sequence[Sequence[int]], replies: Sequence[Reply]
) -> Reply:
    """One reply for a batch command split into `parts` (positions) answered by `replies`.

    Any failed part fails the whole reply with its error; the other parts were still applied
    by their shards (each shard checks the leases of its own part only).
    """
    error = first_error(replies)
    if error is not None:
        return error
    if name == "ACKB":
        return _combine_ackb(ids, parts, replies)
    count = 0
    for reply in replies:
        source = reply.get("data") if name == "JobHeartbeatB" else reply
        count += int((source or {}).get("count") or 0)
    if name == "JobHeartbeatB":
        return {"ok": True, "data": {"ok": True, "count": count}}
    return {"ok": True, "count": count}


def _combine_ackb(
    ids: Sequence[Any], parts: Sequence[Sequence[int]], replies: Sequence[Reply]
) -> Reply:
    ignored: list[int] = []
    for indices, reply in zip(parts, replies, strict=True):
        data = reply.get("data")
        if isinstance(data, Mapping):
            ignored.extend(indices[i] for i in data.get("ignoredIndices") or ())
    if not ignored:
        return {"ok": True}
    ignored.sort()
    data = {"ignoredIds": [ids[i] for i in ignored], "ignoredIndices": ignored}
    return {"ok": True, "data": data}
