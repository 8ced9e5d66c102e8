"""bunqueue's REST routes, each one command to the front end (docs/http.md has the table).

A route is (method, path pattern, builder, kind). The builder turns the path's captures, the
query and the JSON body into the command map; the reply is the front end's, as JSON, exactly
what the TCP port would answer. The status follows bunqueue: reads answer 200 whatever `ok`
says (the reply carries the error), writes 400 when refused, a missing job 404. A command
shardq does not serve yet (crons, flows) answers its `Unsupported command: X` with
501 Not Implemented, so a client can tell "not here" from "refused".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import unquote

from shardq.protocol._commands import ROUTES as SCHEMA_ROUTES
from shardq.protocol._fields import Limits
from shardq.protocol._schema import check as schema_check
from shardq.runtime.http._body import query_int

__all__ = ["ROUTES", "Route", "match", "rest_error", "status_for"]

Body = Mapping[str, Any]
Query = Mapping[str, str]
Builder = Callable[[list[str], Query, Body], dict[str, Any]]
Kind = Literal["read", "write", "find"]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    build: Builder
    kind: Kind = "read"
    wait_key: str | None = None  # the command's own wait (ms), added to the call's timeout
    command: str = ""  # what the schema declares it sends (shardq/protocol/_commands.py)
    path: str = ""


def _int(text: str | None, default: int | None = None) -> int | None:
    # Not a number: the default, as bunqueue; a number beyond 64 bits: 400 (`BadInput`).
    return query_int(text, default)


def _some(**fields: Any) -> dict[str, Any]:
    """A command map without the fields the request left out."""
    return {k: v for k, v in fields.items() if v is not None}


def _push(a: list[str], q: Query, b: Body) -> dict[str, Any]:
    # Every job option the schema declares passes (`attempts` becomes `maxAttempts` there); an
    # unknown key is refused by it with "Unknown option: X", not dropped.
    name = b.get("name") if isinstance(b.get("name"), str) else "default"
    fields = {k: v for k, v in b.items() if k not in ("cmd", "queue", "name", "reqId")}
    return _some(**fields, cmd="PUSH", queue=a[0], name=name)


def _bulk(a: list[str], q: Query, b: Body) -> dict[str, Any]:
    jobs = b.get("jobs")
    named = [
        {**j, "name": j["name"] if isinstance(j.get("name"), str) else "default"}
        if isinstance(j, Mapping)
        else j
        for j in (jobs if isinstance(jobs, list) else [])
    ]
    return {"cmd": "PUSHB", "queue": a[0], "jobs": named}


def _pull(a: list[str], q: Query, b: Body) -> dict[str, Any]:
    return {"cmd": "PULL", "queue": a[0], "timeout": _int(q.get("timeout"), 0)}


def _pull_batch(a: list[str], q: Query, b: Body) -> dict[str, Any]:
    keys = ("count", "timeout", "owner", "lockTtl")
    return _some(cmd="PULLB", queue=a[0], **{k: b.get(k) for k in keys})


def _states(q: Query) -> str | list[str] | None:
    values: list[str] = []
    for key in ("state", "status", "states"):
        getall = getattr(q, "getall", None)
        raw = getall(key, []) if getall is not None else ([q[key]] if key in q else [])
        values += [s.strip() for v in raw for s in str(v).split(",") if s.strip()]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _list(a: list[str], q: Query, b: Body) -> dict[str, Any]:
    limit, offset = _int(q.get("limit")), _int(q.get("offset"))
    return _some(cmd="GetJobs", queue=a[0], state=_states(q), limit=limit, offset=offset)


def _clean(a: list[str], q: Query, b: Body) -> dict[str, Any]:
    grace = b.get("grace") if isinstance(b.get("grace"), int | float) else 0
    return _some(cmd="Clean", queue=a[0], grace=grace, state=b.get("state"), limit=b.get("limit"))


def _dlq(a: list[str], q: Query, b: Body) -> dict[str, Any]:
    # The dashboard pages with limit/offset; bunqueue's older clients send count.
    limit, offset = _int(q.get("limit")), _int(q.get("offset"))
    count = _int(q.get("count")) or limit or 100
    window = _some(offset=offset, limit=limit)
    return _some(cmd="Dlq", queue=a[0], count=count, filter=window or None)


def _queue(cmd: str, *keys: str) -> Builder:
    return lambda a, q, b: _some(cmd=cmd, queue=a[0], **{k: b.get(k) for k in keys})


def _job(cmd: str, *keys: str, id_key: str = "id") -> Builder:
    return lambda a, q, b: _some(cmd=cmd, **{id_key: a[0]}, **{k: b.get(k) for k in keys})


def _cancel(a: list[str], q: Query, b: Body) -> dict[str, Any]:
    # shardq's cancel of a queued or running job (docs/protocol.md §8); DELETE stays bunqueue's.
    return _some(cmd="Cancel", id=a[0], active=True, reason=b.get("reason"))


def _config(cmd: str) -> Builder:
    return lambda a, q, b: {"cmd": cmd, "queue": a[0], "config": b.get("config", b)}


def _body(cmd: str, *keys: str) -> Builder:
    return lambda a, q, b: _some(cmd=cmd, **{k: b.get(k) for k in keys})


def _number(text: str | None) -> int | float | str | None:
    """A query value the schema checks as a number: an int or float when the text is one, the
    text itself otherwise (the schema refuses it in its words), None when absent."""
    if text is None:
        return None
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            continue
    return text


def _history(a: list[str], q: Query, b: Body) -> dict[str, Any]:
    return _some(cmd="DashboardHistory", queue=q.get("queue") or None,
                 minutes=_number(q.get("minutes")))  # fmt: skip


def _search(a: list[str], q: Query, b: Body) -> dict[str, Any]:
    return {"cmd": "DashboardSearch", "q": q.get("q", "")}


_DECLARED: Final = {(r.method, r.path): r.command for r in SCHEMA_ROUTES}


def _r(method: str, path: str, build: Builder, kind: Kind = "read", wait: bool = False) -> Route:
    """A route the schema declares (a KeyError at import for one it does not)."""
    regex = "^" + re.sub(r":\w+", "([^/]+)", path) + "$"
    command = _DECLARED[(method, path)]
    return Route(method, re.compile(regex), build, kind, "timeout" if wait else None, command, path)


Q, J = "/queues/:q", "/jobs/:id"
_WORKER_FIELDS: Final = ("name", "queues", "concurrency", "workerId", "hostname", "pid")
ROUTES: Final[tuple[Route, ...]] = (
    _r("GET", "/queues", _body("ListQueues")),
    _r("POST", f"{Q}/jobs", _push, "write"),
    _r("GET", f"{Q}/jobs", _pull, wait=True),
    _r("POST", f"{Q}/jobs/bulk", _bulk, "write"),
    _r("POST", f"{Q}/jobs/pull-batch", _pull_batch, wait=True),
    _r("GET", f"{Q}/jobs/list", _list),
    _r("GET", f"{Q}/counts", _queue("GetJobCounts")),
    _r("GET", f"{Q}/count", _queue("Count")),
    _r("GET", f"{Q}/priority-counts", _queue("GetCountsPerPriority")),
    _r("GET", f"{Q}/paused", _queue("IsPaused")),
    _r("POST", f"{Q}/pause", _queue("Pause")),
    _r("POST", f"{Q}/resume", _queue("Resume")),
    _r("POST", f"{Q}/drain", _queue("Drain")),
    _r("POST", f"{Q}/obliterate", _queue("Obliterate")),
    _r("POST", f"{Q}/clean", _clean),
    _r("POST", f"{Q}/promote-jobs", _queue("PromoteJobs", "count")),
    _r("POST", f"{Q}/retry-completed", _queue("RetryCompleted", "id")),
    _r("GET", f"{Q}/dlq/stats", _queue("GetDlqStats")),
    _r("GET", f"{Q}/dlq", _dlq),
    _r("POST", f"{Q}/dlq/retry", _queue("RetryDlq", "jobId")),
    _r("POST", f"{Q}/dlq/purge", _queue("PurgeDlq")),
    _r("DELETE", f"{Q}/dlq/:id", lambda a, q, b: {"cmd": "RemoveDlqJob", "queue": a[0],
       "jobId": a[1]}, "write"),
    _r("PUT", f"{Q}/rate-limit", _queue("RateLimit", "limit")),
    _r("DELETE", f"{Q}/rate-limit", _queue("RateLimitClear")),
    _r("PUT", f"{Q}/concurrency", _queue("SetConcurrency", "limit")),
    _r("DELETE", f"{Q}/concurrency", _queue("ClearConcurrency")),
    _r("GET", f"{Q}/stall-config", _queue("GetStallConfig")),
    _r("PUT", f"{Q}/stall-config", _config("SetStallConfig")),
    _r("GET", f"{Q}/dlq-config", _queue("GetDlqConfig")),
    _r("PUT", f"{Q}/dlq-config", _config("SetDlqConfig")),
    _r("POST", "/jobs/ack-batch", _body("ACKB", "ids", "results", "tokens"), "write"),
    _r("POST", "/jobs/extend-locks", _body("ExtendLocks", "ids", "tokens", "durations"), "write"),
    _r("POST", "/jobs/heartbeat-batch", _body("JobHeartbeatB", "ids", "tokens"), "write"),
    _r("GET", "/jobs/custom/:id", _job("GetJobByCustomId", id_key="customId"), "find"),
    _r("GET", J, _job("GetJob"), "find"),
    _r("DELETE", J, _job("Cancel"), "write"),
    _r("POST", f"{J}/cancel", _cancel, "write"),
    _r("POST", f"{J}/ack", _job("ACK", "result", "token"), "write"),
    _r("POST", f"{J}/fail", _job("FAIL", "error", "token", "unrecoverable", "stack"), "write"),
    _r("GET", f"{J}/state", _job("GetState")),
    _r("GET", f"{J}/result", _job("GetResult")),
    _r("GET", f"{J}/progress", _job("GetProgress")),
    _r("POST", f"{J}/progress", _job("Progress", "progress", "message"), "write"),
    _r("PUT", f"{J}/priority", _job("ChangePriority", "priority", "lifo"), "write"),
    _r("PUT", f"{J}/data", _job("Update", "data"), "write"),
    _r("POST", f"{J}/promote", _job("Promote"), "write"),
    _r("POST", f"{J}/discard", _job("Discard", "token"), "write"),
    _r("POST", f"{J}/move-to-delayed", _job("MoveToDelayed", "delay", "token"), "write"),
    _r("POST", f"{J}/move-to-wait", _job("MoveToWait", "token"), "write"),
    _r("PUT", f"{J}/delay", _job("ChangeDelay", "delay"), "write"),
    _r("GET", f"{J}/children", _job("GetChildrenValues"), "find"),
    _r("GET", f"{J}/logs", _job("GetLogs")),
    _r("POST", f"{J}/logs", _job("AddLog", "message", "level"), "write"),
    _r("DELETE", f"{J}/logs", _job("ClearLogs")),
    _r("POST", f"{J}/heartbeat", _job("JobHeartbeat", "token", "duration"), "write"),
    _r("POST", f"{J}/wait", _job("WaitJob", "timeout"), wait=True),
    _r("POST", f"{J}/extend-lock", _job("ExtendLock", "duration", "token"), "write"),
    _r("GET", "/workers", _body("ListWorkers")),
    _r("POST", "/workers", _body("RegisterWorker", *_WORKER_FIELDS), "write"),
    _r("DELETE", "/workers/:id", _job("UnregisterWorker", id_key="workerId"), "write"),
    _r("POST", "/workers/:id/heartbeat", _job("Heartbeat", "activeJobs", "processed", "failed"),
       "write"),
    _r("GET", "/ping", _body("Ping")),
    _r("GET", "/storage", _body("StorageStatus")),
    _r("GET", "/cluster", _body("ClusterStatus")),
    # Features shardq does not have yet: the front end answers "Unsupported command: X".
    _r("GET", "/crons", _body("CronList")),
    _r("POST", "/crons", _body("Cron", "name", "queue", "data", "schedule", "repeatEvery"),
       "write"),
    _r("GET", "/crons/:name", _job("CronGet", id_key="name")),
    _r("DELETE", "/crons/:name", _job("CronDelete", id_key="name"), "write"),
    _r("GET", "/webhooks", _body("ListWebhooks")),
    _r("POST", "/webhooks", _body("AddWebhook", "url", "events", "queue", "secret"), "write"),
    _r("DELETE", "/webhooks/:id", _job("RemoveWebhook", id_key="webhookId"), "write"),
    _r("PUT", "/webhooks/:id/enabled", _job("SetWebhookEnabled", "enabled"), "write"),
    # The dashboard's data: the HTTP process answers these itself (`_charts`).
    _r("GET", "/dashboard/history", _history),
    _r("GET", "/dashboard/search", _search),
)  # fmt: skip


def match(method: str, path: str) -> tuple[Route, list[str]] | None:
    """The route for `method` and `path` with its decoded captures, or None (bunqueue answers
    404 for a known path under another method too)."""
    for route in ROUTES:
        found = route.pattern.match(path)
        if found is not None and route.method == method:
            return route, [unquote(g) for g in found.groups()]
    return None


def rest_error(command: MutableMapping[str, Any], limits: Limits) -> str | None:
    """What the schema refuses in a route's command, or None: the TCP port's words."""
    name = command.get("cmd")
    return schema_check(name, command, limits) if isinstance(name, str) else None


_REFUSAL: Final = re.compile(r"^(Invalid [\w.\[\] ]+: |Unknown option: )")


def status_for(route: Route, reply: Mapping[str, Any]) -> int:
    if reply.get("ok") is True:
        return 200
    error = str(reply.get("error", ""))
    if _REFUSAL.match(error):
        return 400  # a field out of its declared bounds, whatever the route
    if error.startswith("Unsupported command"):
        return 501
    if error.startswith("Server unavailable"):
        return 503
    if route.kind == "find":
        return 404
    return 400 if route.kind == "write" else 200
