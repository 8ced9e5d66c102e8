"""The declaration itself: every command's fields, every job option, every REST route.

Read through `shardq.protocol._schema` (the registry and the checks). Ranges: a time is at most
2^53-1 ms, a duration at most 4.32e15 ms (bunqueue's clamp), a count at most 2^53-1; their sums
stay far below 2^63. Fields marked `worded` are checked by their handler in bunqueue's words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from ._fields import Field, Kind

__all__ = ["COMMANDS", "COMMAND_SUBFIELDS", "JOB_FIELDS", "ROUTES", "Command", "RouteSpec"]

Served = Literal["engine", "shard", "frontend", "http"]
_DAY_MS: Final = 86_400_000
_FRAME_BOUND: Final = 1 << 26  # more items than a 64 MiB frame can hold: the frame bounds it


@dataclass(frozen=True)
class Command:
    """One command: its fields, who answers it, and whether it carries a job's options."""

    name: str
    fields: tuple[Field, ...]
    served: Served = "engine"
    doc: str = ""
    job: bool = False  # its top level (PUSH) or entries (PUSHB, PUSHF) are jobs
    internal: bool = False  # sent between shardq's own processes, never by a client

    @property
    def checked(self) -> tuple[Field, ...]:
        """The fields the generic check covers: all of them, the worded ones only for what
        would overflow (`overflow_error`); their handler words the rest."""
        return self.fields


@dataclass(frozen=True)
class RouteSpec:
    """A REST route and the command it becomes; `path` captures are `:name`."""

    method: str
    path: str
    command: str


def F(name: str, kind: Kind, doc: str = "", **more: Any) -> Field:
    return Field(name, kind, doc, **more)


def W(name: str, kind: Kind, doc: str = "", **more: Any) -> Field:
    """A field its handler checks in bunqueue's own words."""
    return Field(name, kind, doc, worded=True, **more)


QUEUE = F("queue", "queue", "queue name", required=True)
QUEUE_OPT = F("queue", "queue", "queue name")
ID = F("id", "id", "job id", required=True)
TOKEN = F("token", "key", "lease token")
IDS = F("ids", "list", "job ids", item="id", required=True)
TOKENS = F("tokens", "list", "lease tokens, aligned with ids", item="key")
GROUP = W("groupId", "key", "group id", max_len=256, required=True)
LIMIT = F("limit", "count", "a count limit")
COUNT = F("count", "count", "how many")
TIMEOUT = F("timeout", "duration", "long-poll wait (ms)")
# Several nodes on one database answer these commands for every node (docs/cluster.md).
LOCAL = F("local", "bool", "shardq's: this node's answer alone, in a cluster")
CRON_NAME = W("name", "key", "schedule name", max_len=256, required=True)

JOB_FIELDS: Final[tuple[Field, ...]] = (
    W("name", "key", "job name", max_len=256),
    W("data", "any", "job payload (JSON ≤ 10 MiB)"),
    W("priority", "int", "higher first; 0..2097151 lower-first with groupId", lo=-1_000_000,
      hi=1_000_000),
    W("delay", "duration", "ms until ready; negative is ready now", hi=365 * _DAY_MS),
    W("maxAttempts", "int", "total runs; ≤ 0 runs once", lo=1, hi=1000, aliases=("attempts",)),
    W("backoff", "any", "retry base ms, or {type, delay, maxDelay}"),
    W("ttl", "duration", "expire after (ms)", hi=365 * _DAY_MS),
    W("timeout", "duration", "processing timeout (ms); 0 or NaN is none", hi=_DAY_MS),
    W("stallTimeout", "duration", "per-job stall interval (ms)", hi=_DAY_MS),
    F("jobId", "id", "custom id (PUSH)"),
    F("customId", "id", "custom id (PUSHB)"),
    F("uniqueKey", "key", "deduplication key"),
    F("dedup", "map", "{ttl, extend, replace} for uniqueKey"),
    F("dependsOn", "list", "ids that must complete first", item="id"),
    W("childrenIds", "list", "children of a flow parent", item="id"),
    F("parentId", "id", "flow parent"),
    F("parentQueue", "queue", "where the flow parent lives"),
    F("tags", "list", "free labels", item="id"),
    W("groupId", "key", "job group", max_len=256),
    F("groupMaxSize", "count", "per-group depth cap"),
    F("lifo", "flag", "last in, first out"),
    F("removeOnComplete", "flag", "drop on completion"),
    F("removeOnFail", "flag", "drop on terminal failure"),
    F("durable", "flag", "write through, no buffer"),
    F("repeat", "map", "{every, limit, pattern, ...}"),
    F("debounceId", "key", "debounce key"),
    F("debounceTtl", "duration", "debounce window (ms)"),
    F("stackTraceLimit", "count", "stack lines kept"),
    F("keepLogs", "count", "log lines kept"),
    F("sizeLimit", "count", "stored, not acted on"),
    F("timestamp", "time", "overrides createdAt (epoch ms)"),
    F("failParentOnFailure", "flag", "fail the parent on terminal failure"),
    F("removeDependencyOnFailure", "flag", "drop the parent's dependency on failure"),
    F("continueParentOnFailure", "flag", "release the parent on failure"),
    F("ignoreDependencyOnFailure", "flag", "count a failure as done"),
)  # fmt: skip

# The keys of map fields checked one by one (`<field>.<key>`).
COMMAND_SUBFIELDS: Final[dict[str, tuple[Field, ...]]] = {
    "dedup": (F("ttl", "duration"),),
    "filter": (F("offset", "count"), F("limit", "count")),
    "repeat": (F("every", "duration"), F("limit", "count"), F("count", "count"),
               F("startDate", "time"), F("endDate", "time"), F("offset", "duration"),
               F("pattern", "key", max_len=256)),
    "config": (F("stallInterval", "duration"), F("maxStalls", "count"),
               F("gracePeriod", "duration"), F("autoRetryInterval", "duration"),
               F("maxAutoRetries", "count"), F("maxAge", "duration"),
               F("maxEntries", "count")),
    "jobOptions": (F("maxAttempts", "int", lo=-1000, hi=1000), F("timeout", "duration"),
                   F("delay", "int", lo=-365 * _DAY_MS, hi=365 * _DAY_MS),
                   F("stallTimeout", "duration")),
}  # fmt: skip


def C(name: str, *fields: Field, served: Served = "engine", doc: str = "", **more: Any) -> Command:
    return Command(name, fields, served, doc, **more)


_PUSH_TOP = (QUEUE, *JOB_FIELDS)
_GROUP = (W("queue", "queue", required=True), GROUP)
_CRON = (
    CRON_NAME, QUEUE, W("data", "any", "job payload"), F("jobName", "key", max_len=256),
    F("schedule", "key", "5- or 6-field cron", max_len=256),
    W("repeatEvery", "duration", "ms between runs", lo=1), F("timezone", "key", max_len=64),
    F("immediately", "flag"), W("maxLimit", "int", "≤ 0 is unlimited"),
    F("priority", "int", lo=-1_000_000, hi=1_000_000), F("uniqueKey", "key"), F("dedup", "map"),
    F("skipMissedOnRestart", "flag"), F("skipIfNoWorker", "flag"), F("preventOverlap", "flag"),
    F("jobOptions", "map", max_len=64),
)  # fmt: skip

COMMANDS: Final[tuple[Command, ...]] = (
    # -- producing
    C("PUSH", *_PUSH_TOP, job=True, doc="one job"),
    C("PUSHB", QUEUE, F("jobs", "list", "job objects (customId, not jobId)", required=True,
                        max_len=_FRAME_BOUND),
      job=True, doc="many jobs"),
    C("PUSHF", F("jobs", "list", "[{id, queue, input}] nodes of a flow", required=True,
                 max_len=_FRAME_BOUND),
      F("hold", "flag", "another node's part of a flow: held until PeerFlowRelease"),
      served="frontend", job=True, doc="an atomic flow"),
    # -- consuming and leases
    C("PULL", QUEUE, W("timeout", "duration", "long-poll wait (ms)"), F("owner", "key"),
      F("lockTtl", "duration"), F("detach", "flag"), F("group", "key"), served="shard"),
    C("PULLB", QUEUE, W("count", "int", "1..1000", required=True),
      W("timeout", "duration", "long-poll wait (ms)"), F("owner", "key"),
      F("lockTtl", "duration"), F("group", "key"), served="shard"),
    C("ACK", ID, TOKEN, F("result", "any"), F("removeOnComplete", "flag")),
    C("ACKB", W("ids", "list", "job ids", required=True), W("tokens", "list"),
      W("results", "list"), W("removeOnCompletes", "list")),
    C("FAIL", ID, TOKEN, W("error", "text"), W("stack", "list", "lines (strings)"),
      F("unrecoverable", "flag"), F("removeOnFail", "flag")),
    C("JobHeartbeat", ID, TOKEN, F("duration", "duration")),
    C("JobHeartbeatB", W("ids", "list", "job ids", required=True), W("tokens", "list")),
    C("ExtendLock", ID, TOKEN, F("duration", "duration")),
    C("ExtendLocks", IDS, TOKENS, F("durations", "list", item="duration")),
    # -- workers (the front end's registry)
    C("RegisterWorker", F("name", "key", max_len=256), F("queues", "list", item="key"),
      F("concurrency", "count"), F("workerId", "key"), F("hostname", "key"), F("pid", "count"),
      F("startedAt", "time"), served="frontend"),
    C("UnregisterWorker", F("workerId", "key"), served="frontend"),
    C("Heartbeat", F("id", "key", "worker id"), F("activeJobs", "count"),
      F("processed", "count"), F("failed", "count"), served="frontend"),
    C("ListWorkers", LOCAL, served="frontend"),
    # -- reading jobs
    C("GetJob", ID),
    C("GetJobByCustomId", F("customId", "id", required=True)),
    C("GetState", ID),
    C("GetResult", ID),
    C("GetProgress", ID),
    C("GetJobCounts", QUEUE, F("totals", "flag"),
      F("history", "count", "shardq's: minutes of per-minute history (the dashboard)")),
    C("GetCountsPerPriority", QUEUE),
    C("Count", QUEUE),
    C("GetJobs", QUEUE, F("state", "any"), F("offset", "count"), F("limit", "count"),
      F("asc", "flag"), F("name", "key", "shardq's: part of the job name (the dashboard)",
                          max_len=256)),
    C("WaitJob", ID, F("timeout", "duration"), served="shard"),
    C("GetLogs", ID, F("start", "int"), F("end", "int")),
    C("AddLog", ID, F("message", "text", required=True), F("level", "key", max_len=64)),
    C("ClearLogs", ID, F("keepLogs", "count")),
    C("GetChildrenValues", ID),
    C("GetFailedChildrenValues", ID),
    C("GetIgnoredChildrenFailures", ID),
    C("GetDeduplicationJobId", QUEUE, F("deduplicationId", "key")),
    # -- changing jobs
    C("Cancel", ID, F("active", "bool", "shardq's: also stop a running job"),
      F("reason", "text", "shardq's: kept as the failed reason")),
    C("Discard", ID, TOKEN),
    C("Promote", ID),
    C("PromoteJobs", QUEUE, COUNT),
    C("MoveToWait", ID, TOKEN),
    C("MoveToDelayed", ID, W("delay", "duration", hi=365 * _DAY_MS), TOKEN),
    C("MoveToWaitingChildren", ID, TOKEN),
    C("ChangePriority", ID, W("priority", "int", lo=-1_000_000, hi=1_000_000),
      F("lifo", "flag")),
    C("ChangeDelay", ID, W("delay", "duration", hi=365 * _DAY_MS)),
    C("Update", ID, W("data", "any")),
    C("UpdateParent", F("childId", "id", required=True), F("parentId", "id", required=True)),
    C("Progress", ID, F("progress", "number"), F("message", "text")),
    C("RemoveChildDependency", ID),
    C("RemoveUnprocessedChildren", ID, served="frontend"),
    C("RemoveDeduplicationKey", QUEUE, F("deduplicationId", "key")),
    C("RemoveJobDeduplicationKey", ID),
    # -- queues
    C("Pause", QUEUE),
    C("Resume", QUEUE),
    C("IsPaused", QUEUE),
    C("Drain", QUEUE),
    C("Obliterate", QUEUE),
    C("Clean", QUEUE, F("grace", "duration"), W("state", "key", max_len=64), LIMIT),
    C("ListQueues", LOCAL, served="frontend"),
    C("Dlq", QUEUE, COUNT, F("filter", "map")),
    C("GetDlqStats", QUEUE),
    C("RetryDlq", QUEUE, COUNT, F("jobId", "id")),
    C("PurgeDlq", QUEUE),
    C("RemoveDlqJob", QUEUE, F("jobId", "id")),
    C("RetryCompleted", QUEUE, COUNT, F("id", "id")),
    C("SetDlqConfig", QUEUE, W("config", "map", max_len=64)),
    C("GetDlqConfig", QUEUE),
    C("SetStallConfig", QUEUE, W("config", "map", max_len=64)),
    C("GetStallConfig", QUEUE),
    # -- limits
    C("RateLimit", QUEUE, W("limit", "count", required=True), W("duration", "duration", lo=1),
      W("ttl", "duration", lo=1)),
    C("RateLimitClear", QUEUE),
    C("SetConcurrency", QUEUE, W("limit", "count", required=True)),
    C("ClearConcurrency", QUEUE),
    C("GetQueueLimits", QUEUE, W("maxJobs", "count")),
    # -- groups
    C("GetGroupJobsCount", *_GROUP),
    C("GetGroupActiveCount", *_GROUP),
    C("GetGroupsJobsCount", W("queue", "queue", required=True)),
    C("SetGroupRateLimit", *_GROUP, W("limit", "count", required=True),
      W("duration", "duration", lo=1)),
    C("GetGroupRateLimit", *_GROUP),
    C("RemoveGroupRateLimit", *_GROUP),
    C("GetGroupRateLimitTtl", *_GROUP, W("maxJobs", "count")),
    C("SetGroupConcurrency", *_GROUP, W("limit", "count", required=True)),
    C("GetGroupConcurrency", *_GROUP),
    C("RemoveGroupConcurrency", *_GROUP),
    C("PauseGroup", *_GROUP),
    C("ResumeGroup", *_GROUP),
    C("IsGroupPaused", *_GROUP),
    C("RateLimitGroup", *_GROUP, W("ttl", "duration")),
    # -- cron
    C("Cron", *_CRON, served="frontend", doc="upsert a schedule"),
    C("CronGet", CRON_NAME, served="frontend"),
    C("CronList", served="frontend"),
    C("CronDelete", CRON_NAME, served="frontend"),
    # -- session and monitoring (the front end's own)
    C("Ping", served="frontend"),
    C("Hello", F("protocolVersion", "int", lo=0, hi=1000), served="frontend"),
    C("Auth", F("token", "key", max_len=4096), served="frontend"),
    C("Stats", LOCAL, served="frontend"),
    C("Metrics", QUEUE_OPT, LOCAL, served="frontend"),
    C("TrimEvents", QUEUE_OPT, W("maxLength", "count"), served="frontend"),
    C("Prometheus", served="frontend"),
    C("StorageStatus", served="frontend"),
    C("ClusterStatus", served="frontend",
      doc="the nodes on this database and the partitions each holds (docs/cluster.md)"),
    C("NoForward", F("node", "key", "the node whose link this is", max_len=256),
      served="frontend",
      doc="answer MOVED on this connection instead of forwarding (docs/cluster.md)"),
    # -- node to node, on a peer's link only (`NoForward {node}`): flows across nodes
    C("PeerFlowNotify", QUEUE_OPT, F("items", "list", "child-finished notices", required=True,
                                     max_len=_FRAME_BOUND),
      served="frontend", doc="notices for flow parents on this node's queues"),
    C("PeerFlowRelease", F("ids", "list", item="id", required=True, max_len=_FRAME_BOUND),
      F("queues", "list", "each id's queue", item="queue", required=True, max_len=_FRAME_BOUND),
      served="frontend", doc="release a flow's part this node holds"),
    C("PeerFlowHeld", F("ids", "list", item="id", required=True, max_len=_FRAME_BOUND),
      served="frontend", doc="which of these ids this node's shards hold"),
    C("CompactMemory", served="shard"),
    C("DashboardOverview", served="frontend"),
    C("DashboardQueues", F("limit", "count"), F("offset", "count"), served="frontend"),
    C("DashboardQueue", QUEUE, F("includeJobs", "flag"), F("limit", "count"),
      F("offset", "count"), served="frontend"),
    C("SubscribeEvents", QUEUE_OPT, F("all", "flag"), F("since", "any"),
      F("events", "list", item="key", max_len=64), served="frontend"),
    C("UnsubscribeEvents", QUEUE_OPT, F("all", "flag"), served="frontend"),
    # -- webhooks
    C("AddWebhook", W("url", "key", "http(s) URL", max_len=2048, required=True),
      W("events", "list", "event names", max_len=64), W("queue", "key", max_len=256),
      W("secret", "key", max_len=1024),
      F("webhookId", "key", "several nodes: the id the first node gave it", max_len=256),
      F("createdAt", "time", "several nodes: when the first node added it"),
      served="frontend"),
    C("RemoveWebhook", F("webhookId", "key", required=True), served="frontend"),
    C("ListWebhooks", served="frontend"),
    C("SetWebhookEnabled", F("id", "key", required=True), W("enabled", "bool", required=True),
      served="frontend"),
    C("Backup", F("action", "key", "now, list, status or verify", max_len=16, required=True),
      F("key", "key", "verify: the backup's key", max_len=1024), served="frontend",
      doc="a snapshot through the running server"),
    C("AuthCheck", F("token", "key", max_len=4096), F("address", "key", max_len=64),
      served="frontend", internal=True,
      doc="the HTTP process's bearer check, counted per address"),
    C("WebhookSync", F("tally", "list", max_len=100_000), served="http", internal=True,
      doc="the HTTP process reads the registry and reports deliveries"),
    # -- the dashboard's data, answered by the HTTP process itself (REST only)
    C("DashboardHistory", F("queue", "queue", "one queue; every queue when absent"),
      F("minutes", "int", "the window, one point per minute (default 60)", lo=1, hi=1440),
      served="http", doc="per-minute throughput and job times"),
    C("DashboardSearch", F("q", "key", "a job id, a custom id or part of a job name",
      required=True), served="http", doc="look a job up"),
    # -- shard to shard, through the front end
    C("FlowNotify", F("ids", "list", item="id"), served="engine", internal=True),
    C("FlowRelease", F("ids", "list", item="id"), served="engine", internal=True),
    C("FlowHeld", F("ids", "list", item="id"), served="engine", internal=True,
      doc="which of these ids the shard holds: the front end's look for a parent's children"),
)  # fmt: skip


ROUTES: Final[tuple[RouteSpec, ...]] = tuple(
    RouteSpec(m, p, c)
    for m, p, c in (
        ("GET", "/queues", "ListQueues"),
        ("POST", "/queues/:q/jobs", "PUSH"),
        ("GET", "/queues/:q/jobs", "PULL"),
        ("POST", "/queues/:q/jobs/bulk", "PUSHB"),
        ("POST", "/queues/:q/jobs/pull-batch", "PULLB"),
        ("GET", "/queues/:q/jobs/list", "GetJobs"),
        ("GET", "/queues/:q/counts", "GetJobCounts"),
        ("GET", "/queues/:q/count", "Count"),
        ("GET", "/queues/:q/priority-counts", "GetCountsPerPriority"),
        ("GET", "/queues/:q/paused", "IsPaused"),
        ("POST", "/queues/:q/pause", "Pause"),
        ("POST", "/queues/:q/resume", "Resume"),
        ("POST", "/queues/:q/drain", "Drain"),
        ("POST", "/queues/:q/obliterate", "Obliterate"),
        ("POST", "/queues/:q/clean", "Clean"),
        ("POST", "/queues/:q/promote-jobs", "PromoteJobs"),
        ("POST", "/queues/:q/retry-completed", "RetryCompleted"),
        ("GET", "/queues/:q/dlq/stats", "GetDlqStats"),
        ("GET", "/queues/:q/dlq", "Dlq"),
        ("POST", "/queues/:q/dlq/retry", "RetryDlq"),
        ("POST", "/queues/:q/dlq/purge", "PurgeDlq"),
        ("DELETE", "/queues/:q/dlq/:id", "RemoveDlqJob"),
        ("PUT", "/queues/:q/rate-limit", "RateLimit"),
        ("DELETE", "/queues/:q/rate-limit", "RateLimitClear"),
        ("PUT", "/queues/:q/concurrency", "SetConcurrency"),
        ("DELETE", "/queues/:q/concurrency", "ClearConcurrency"),
        ("GET", "/queues/:q/stall-config", "GetStallConfig"),
        ("PUT", "/queues/:q/stall-config", "SetStallConfig"),
        ("GET", "/queues/:q/dlq-config", "GetDlqConfig"),
        ("PUT", "/queues/:q/dlq-config", "SetDlqConfig"),
        ("POST", "/jobs/ack-batch", "ACKB"),
        ("POST", "/jobs/extend-locks", "ExtendLocks"),
        ("POST", "/jobs/heartbeat-batch", "JobHeartbeatB"),
        ("GET", "/jobs/custom/:id", "GetJobByCustomId"),
        ("GET", "/jobs/:id", "GetJob"),
        ("DELETE", "/jobs/:id", "Cancel"),
        ("POST", "/jobs/:id/cancel", "Cancel"),
        ("POST", "/jobs/:id/ack", "ACK"),
        ("POST", "/jobs/:id/fail", "FAIL"),
        ("GET", "/jobs/:id/state", "GetState"),
        ("GET", "/jobs/:id/result", "GetResult"),
        ("GET", "/jobs/:id/progress", "GetProgress"),
        ("POST", "/jobs/:id/progress", "Progress"),
        ("PUT", "/jobs/:id/priority", "ChangePriority"),
        ("PUT", "/jobs/:id/data", "Update"),
        ("POST", "/jobs/:id/promote", "Promote"),
        ("POST", "/jobs/:id/discard", "Discard"),
        ("POST", "/jobs/:id/move-to-delayed", "MoveToDelayed"),
        ("POST", "/jobs/:id/move-to-wait", "MoveToWait"),
        ("PUT", "/jobs/:id/delay", "ChangeDelay"),
        ("GET", "/jobs/:id/children", "GetChildrenValues"),
        ("GET", "/jobs/:id/logs", "GetLogs"),
        ("POST", "/jobs/:id/logs", "AddLog"),
        ("DELETE", "/jobs/:id/logs", "ClearLogs"),
        ("POST", "/jobs/:id/heartbeat", "JobHeartbeat"),
        ("POST", "/jobs/:id/wait", "WaitJob"),
        ("POST", "/jobs/:id/extend-lock", "ExtendLock"),
        ("GET", "/workers", "ListWorkers"),
        ("POST", "/workers", "RegisterWorker"),
        ("DELETE", "/workers/:id", "UnregisterWorker"),
        ("POST", "/workers/:id/heartbeat", "Heartbeat"),
        ("GET", "/ping", "Ping"),
        ("GET", "/storage", "StorageStatus"),
        ("GET", "/cluster", "ClusterStatus"),
        ("GET", "/crons", "CronList"),
        ("POST", "/crons", "Cron"),
        ("GET", "/crons/:name", "CronGet"),
        ("DELETE", "/crons/:name", "CronDelete"),
        ("GET", "/webhooks", "ListWebhooks"),
        ("POST", "/webhooks", "AddWebhook"),
        ("DELETE", "/webhooks/:id", "RemoveWebhook"),
        ("PUT", "/webhooks/:id/enabled", "SetWebhookEnabled"),
        ("GET", "/dashboard/history", "DashboardHistory"),
        ("GET", "/dashboard/search", "DashboardSearch"),
    )
)
"""Every REST route of the HTTP port and the command it sends (docs/http.md)."""
