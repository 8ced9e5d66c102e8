"""The dashboard's history and search routes: `/dashboard/history` and `/dashboard/search`.

The history is the shards' own (`shardq.core._history`): per queue and per minute, jobs pushed,
completed and failed for good, and how long the completed ones waited and ran, as bucket
counts. `GetJobCounts` with `history` reads one queue's; the whole server is the sum over the
first `metrics_max_queues` queues by name (the cap the Prometheus series have), and
percentiles come out of the summed buckets, so they are exact to a bucket, interpolated
linearly inside it. Every minute of the window is in the answer, quiet ones as zeros, so a
chart has a point per minute.

The search looks a text up as a job id and as a custom id, and as part of a job name in each
of the first `metrics_max_queues` queues (at most `_NAME_HITS` jobs from each).

Both are commands of the one schema (`DashboardHistory`, `DashboardSearch`, served by this
process): `Charts.call` answers them after the schema's check, and hands every other command
to the front end, so the REST routes and the MCP tools reach them the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from shardq.protocol._fields import Limits
from shardq.protocol._schema import check as schema_check
from shardq.runtime import _clock
from shardq.runtime.http._backend import Backend

__all__ = ["Charts", "percentile"]

_DEFAULT_MINUTES: Final = 60  # the schema bounds a request to 1..1,440 (a day)
_NAME_HITS: Final = 20
_MAX_RESULTS: Final = 100
_JOB_FIELDS: Final = ("id", "name", "queue", "state", "createdAt", "customId", "failedReason")


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def percentile(counts: Sequence[int], bounds: Sequence[float], p: float) -> float | None:
    """The `p` quantile (0..1) of values counted per bucket (`counts[i]` at most `bounds[i]`,
    the last bucket unbounded), interpolated inside its bucket; None when nothing was counted.
    A quantile in the unbounded bucket reads as the last bound."""
    total = sum(counts)
    if total == 0:
        return None
    rank = p * total
    running = 0
    for i, count in enumerate(counts):
        if count and running + count >= rank:
            if i >= len(bounds):
                return float(bounds[-1])
            low = float(bounds[i - 1]) if i > 0 else 0.0
            return round(low + (bounds[i] - low) * (rank - running) / count, 2)
        running += count
    return float(bounds[-1])


def _add(into: list[int] | None, counts: object) -> list[int] | None:
    if not isinstance(counts, list):
        return into
    if into is None:
        return [int(c) for c in counts]
    return [a + int(b) for a, b in zip(into, counts, strict=False)]


class _Minute:
    __slots__ = ("completed", "failed", "pushed", "run", "wait")

    def __init__(self) -> None:
        self.pushed = self.completed = self.failed = 0
        self.wait: list[int] | None = None
        self.run: list[int] | None = None


def _series(
    replies: Sequence[Mapping[str, Any]], now_ms: int, minutes: int
) -> tuple[list[dict[str, Any]], list[float]]:
    """Sum the queues' minutes; one point per minute of the window, oldest first."""
    minute_ms, bounds = 60_000, [1.0]
    summed: dict[int, _Minute] = {}
    for reply in replies:
        history = _map(reply.get("history"))
        minute_ms = int(history.get("minuteMs") or minute_ms)
        bounds = [float(b) for b in history.get("bounds") or bounds]
        for row in history.get("minutes") or []:
            if not isinstance(row, list) or len(row) != 6:
                continue
            at, pushed, completed, failed, wait, run = row
            entry = summed.setdefault(int(at), _Minute())
            entry.pushed += int(pushed)
            entry.completed += int(completed)
            entry.failed += int(failed)
            entry.wait, entry.run = _add(entry.wait, wait), _add(entry.run, run)
    newest = now_ms // minute_ms * minute_ms
    points = []
    for k in range(minutes - 1, -1, -1):
        at = newest - k * minute_ms
        e = summed.get(at) or _Minute()
        # The minute in progress has lasted only this long: its rate is over that time.
        seconds = max(1.0, (now_ms - at) / 1000) if k == 0 else minute_ms / 1000
        points.append(
            {
                "at": at,
                "pushed": e.pushed,
                "completed": e.completed,
                "failed": e.failed,
                "pushPerSec": round(e.pushed / seconds, 3),
                "completePerSec": round(e.completed / seconds, 3),
                "failPerSec": round(e.failed / seconds, 3),
                "waitMs": _quantiles(e.wait, bounds),
                "runMs": _quantiles(e.run, bounds),
            }
        )
    return points, bounds


def _quantiles(counts: list[int] | None, bounds: list[float]) -> dict[str, float | None]:
    if counts is None:
        return {"p50": None, "p99": None}
    return {"p50": percentile(counts, bounds, 0.5), "p99": percentile(counts, bounds, 0.99)}


class Charts:
    def __init__(self, backend: Backend, max_queues: int, limits: Limits | None = None) -> None:
        self._backend = backend
        self._max_queues = max_queues
        self._limits = limits or Limits()

    async def call(self, command: Mapping[str, Any], *, wait_ms: float = 0) -> dict[str, Any]:
        """A command's reply: the dashboard's own answered here, any other by the front end."""
        name = command.get("cmd")
        if name not in ("DashboardHistory", "DashboardSearch"):
            return await self._backend.call(command, wait_ms=wait_ms)
        error = schema_check(name, command, self._limits)
        if error:
            return {"ok": False, "error": error}
        if name == "DashboardSearch":
            return await self.search(str(command["q"]))
        queue, minutes = command.get("queue"), command.get("minutes")
        return await self.history(queue if isinstance(queue, str) else None, minutes)

    async def _queues(self) -> tuple[list[str], int] | Mapping[str, Any]:
        listed = await self._backend.call({"cmd": "ListQueues"})
        if listed.get("ok") is not True:
            return listed
        names = sorted(q for q in listed.get("queues") or [] if isinstance(q, str))
        return names[: self._max_queues], max(0, len(names) - self._max_queues)

    async def history(self, queue: str | None, minutes: int | None) -> dict[str, Any]:
        """`minutes` as the schema let it through (an int in 1..1,440), or None: the default."""
        minutes = minutes or _DEFAULT_MINUTES
        if queue:
            names, omitted = [queue], 0
        else:
            found = await self._queues()
            if isinstance(found, Mapping):
                return dict(found)
            names, omitted = found
        replies = await self._backend.call_many(
            [{"cmd": "GetJobCounts", "queue": q, "history": minutes} for q in names]
        )
        failed = next((r for r in replies if r.get("ok") is not True), None)
        if failed is not None:
            return dict(failed)
        now_ms = int(_clock.wall() * 1000)
        points, bounds = _series(replies, now_ms, minutes)
        return {
            "ok": True,
            "queue": queue or None,
            "queues": len(names),
            "omitted": omitted,
            "minutes": minutes,
            "bounds": bounds,
            "points": points,
            "timestamp": now_ms,
        }

    async def search(self, text: str) -> dict[str, Any]:
        text = text.strip()
        if not text:
            # In the schema's words, so the route answers 400 as for any refused field.
            return {"ok": False, "error": "Invalid q: must not be blank"}
        found = await self._queues()
        if isinstance(found, Mapping):
            return dict(found)
        names, omitted = found
        commands: list[dict[str, Any]] = [
            {"cmd": "GetJobByCustomId", "customId": text},
            {"cmd": "GetJob", "id": text},
        ] + [{"cmd": "GetJobs", "queue": q, "name": text, "limit": _NAME_HITS} for q in names]
        replies = await self._backend.call_many(commands)
        hits: dict[str, dict[str, Any]] = {}
        for i, reply in enumerate(replies):
            how = ("customId", "id")[i] if i < 2 else "name"
            jobs = [reply.get("job")] if i < 2 else reply.get("jobs") or []
            for job in jobs:
                if isinstance(job, Mapping) and isinstance(job.get("id"), str):
                    hits.setdefault(
                        job["id"], {f: job.get(f) for f in _JOB_FIELDS} | {"match": how}
                    )
        jobs = list(hits.values())
        return {
            "ok": True,
            "jobs": jobs[:_MAX_RESULTS],
            "truncated": len(jobs) > _MAX_RESULTS,
            "queuesSearched": len(names),
            "queuesOmitted": omitted,
        }
