"""bunqueue's dashboard JSON routes: `/dashboard`, `/dashboard/queues`, `/dashboard/queues/:q`.

Aggregates for a dashboard that wants one call per screen, built from the same commands as the
REST routes. The completion rate comes from the front end's lifetime count, sampled here like
the per-queue rates (`_rates.py`); shardq keeps no failure rate (0). The latency averages come
from the front end's histograms (their percentiles are not kept, so `percentiles` is empty).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from shardq.runtime import _clock
from shardq.runtime.http._backend import Backend
from shardq.runtime.http._monitor import UNREACHABLE, Monitor, unreachable
from shardq.runtime.http._rates import QueueRates

__all__ = ["Overview"]

_MB: Final = 1024 * 1024
_LIST_CAP: Final = 100  # bunqueue lists at most this many workers or crons, then `truncated`
_PREVIEW: Final = 10  # jobs per state, and DLQ entries, in a queue's detail


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(text: str | None, default: int, high: int) -> int:
    try:
        return max(0, min(high, int(text))) if text is not None else default
    except ValueError:
        return default


def _average_ms(histogram: object) -> float:
    h = _map(histogram)
    count = sum(c for c in h.get("counts") or [] if isinstance(c, int))
    total = h.get("sum")
    return round(total / count, 2) if count and isinstance(total, int | float) else 0.0


def _crons(reply: Mapping[str, Any]) -> dict[str, Any]:
    crons = [c for c in reply.get("crons") or [] if isinstance(c, Mapping)]
    fields = ("name", "queue", "schedule", "repeatEvery", "nextRun", "executions")
    return {
        "total": len(crons),
        "list": [{f: c.get(f) for f in fields} for c in crons[:_LIST_CAP]],
        "truncated": len(crons) > _LIST_CAP,
    }


class Overview:
    def __init__(self, backend: Backend, monitor: Monitor) -> None:
        self._backend = backend
        self._monitor = monitor
        self._server_rates = QueueRates()  # one entry: the whole server's completions

    async def overview(self) -> dict[str, Any]:
        snap = await self._monitor.snapshot()
        listed, crons = await self._backend.call_many([{"cmd": "ListWorkers"}, {"cmd": "CronList"}])
        workers = _map(listed.get("data")).get("workers") or []
        s, m = snap.stats, snap.metrics
        totals = {"pushed": m.get("totalPushed"), "completed": m.get("totalCompleted")}
        rates = self._server_rates.observe("", totals, time.monotonic())
        keys = ("totalPushed", "totalPulled", "totalCompleted", "totalFailed")
        fields = ("id", "name", "queues", "lastSeen", "activeJobs", "processedJobs", "failedJobs")
        body = {
            "ok": snap.reachable,
            "stats": {k: s.get(k, 0) for k in ("waiting", "active", "delayed", "completed", "dlq")}
            | {k: m.get(k, 0) for k in keys}
            | {"uptime": s.get("uptime", 0)},
            "throughput": {
                "pushPerSec": s.get("pushPerSec", 0),
                "pullPerSec": s.get("pullPerSec", 0),
                "completePerSec": rates["completePerSec"] or 0,
                "failPerSec": 0,  # not kept
            },
            "latency": {
                "averages": {k: _average_ms(snap.latency.get(k)) for k in ("push", "pull", "ack")},
                "percentiles": {},
            },
            "memory": {"rss": round(sum(p.rss_bytes for p in snap.processes) / _MB)},
            "workers": {
                "total": len(workers),
                "active": sum(1 for w in workers if _map(w).get("status") == "active"),
                "list": [{f: _map(w).get(f) for f in fields} for w in workers[:_LIST_CAP]],
                "truncated": len(workers) > _LIST_CAP,
            },
            "crons": _crons(crons),
            "storage": snap.storage.as_json(),
            "timestamp": int(_clock.wall() * 1000),
        }
        # Several nodes: the counts are every node's; memory and storage this node's.
        missing = sorted({*snap.unreachable, *unreachable(listed, crons)})
        if missing:
            body[UNREACHABLE] = missing
        return body

    async def queues(self, limit_text: str | None, offset_text: str | None) -> dict[str, Any]:
        limit, offset = _int(limit_text, 100, 1000), _int(offset_text, 0, 10**9)
        listed = await self._backend.call({"cmd": "ListQueues"})
        if listed.get("ok") is not True:
            return listed
        names = [q for q in listed.get("queues") or [] if isinstance(q, str)]
        page = names[offset : offset + limit]
        commands: list[dict[str, Any]] = []
        for q in page:
            commands += [
                {"cmd": "GetJobCounts", "queue": q, "totals": True},
                {"cmd": "IsPaused", "queue": q},
            ]
        replies = await self._backend.call_many(commands)
        queues = []
        now = time.monotonic()
        rates = self._monitor.rates
        rates.keep_only(names)
        for i, name in enumerate(page):
            c = _map(replies[2 * i].get("counts"))
            throughput = rates.observe(name, _map(replies[2 * i].get("totals")), now)
            queues.append(
                {
                    "name": name,
                    "waiting": c.get("waiting", 0),
                    "delayed": c.get("delayed", 0),
                    "active": c.get("active", 0),
                    "dlq": c.get("failed", 0),
                    "paused": replies[2 * i + 1].get("paused") is True,
                    **throughput,
                }
            )
        body = {
            "ok": True,
            "queues": queues,
            "total": len(names),
            "limit": limit,
            "offset": offset,
            "timestamp": int(_clock.wall() * 1000),
        }
        if listed.get(UNREACHABLE):
            body[UNREACHABLE] = unreachable(listed)
        return body

    async def queue(self, name: str, include_jobs: bool) -> dict[str, Any]:
        states = ("waiting", "active", "delayed", "paused") if include_jobs else ()
        commands: list[dict[str, Any]] = [
            {"cmd": "GetJobCounts", "queue": name},
            {"cmd": "IsPaused", "queue": name},
            {"cmd": "Dlq", "queue": name, "count": _PREVIEW},
            {"cmd": "GetCountsPerPriority", "queue": name},
        ]
        for state in states:
            commands.append({"cmd": "GetJobs", "queue": name, "state": state, "limit": _PREVIEW})
        replies = await self._backend.call_many(commands)
        counts, paused, dlq, priorities = replies[:4]
        if counts.get("ok") is not True:
            return counts
        preview = ("id", "data", "attempts", "createdAt")
        body: dict[str, Any] = {
            "ok": True,
            "name": name,
            "counts": counts.get("counts"),
            "paused": paused.get("paused") is True,
            "priorityCounts": priorities.get("counts"),
            "dlqPreview": [{k: _map(j).get(k) for k in preview} for j in dlq.get("jobs") or []],
            "timestamp": int(_clock.wall() * 1000),
        }
        if include_jobs:
            summary = ("id", "priority", "createdAt", "runAt", "attempts", "progress")
            body["jobs"] = {
                state: [{k: _map(j).get(k) for k in summary} for j in reply.get("jobs") or []]
                for state, reply in zip(states, replies[4:], strict=True)
            }
        return body
