"""The names the engine answers to, apart from the engine: its commands, and the internal
ones shards send each other through the front end.

The front end routes by these names and never runs the engine; this module imports nothing,
so it does not load the engine's parts (and croniter, dateutil and zoneinfo with them) for a
few sets of strings. `_engine.py` builds its registry from `COMMANDS`.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "COMMANDS",
    "FLOW_HELD",
    "FLOW_NOTIFY",
    "FLOW_RELEASE",
    "GROUP_COMMANDS",
    "INTERNAL_COMMANDS",
    "PENDING_PARENT",
]

FLOW_NOTIFY: Final = "FlowNotify"
"""Internal command: notices for parents this shard holds (never accepted from a client)."""
FLOW_RELEASE: Final = "FlowRelease"
"""Internal command: the jobs of a PUSHF held until every shard admitted its part."""
FLOW_HELD: Final = "FlowHeld"
"""Internal command: which of these ids this shard holds (or saw complete): the front end's
look for the children a parent still waits for (`shardq.runtime.frontend._orphans`)."""

# A child's parentId before bunqueue-client 0.1.5's UpdateParent links it to the real one.
PENDING_PARENT: Final = "pending"

GROUP_COMMANDS: dict[str, str] = {
    "GetGroupJobsCount": "cmd_get_group_jobs_count",
    "GetGroupsJobsCount": "cmd_get_groups_jobs_count",
    "GetGroupActiveCount": "cmd_get_group_active_count",
    "SetGroupRateLimit": "cmd_set_group_rate_limit",
    "GetGroupRateLimit": "cmd_get_group_rate_limit",
    "RemoveGroupRateLimit": "cmd_remove_group_rate_limit",
    "GetGroupRateLimitTtl": "cmd_get_group_rate_limit_ttl",
    "SetGroupConcurrency": "cmd_set_group_concurrency",
    "GetGroupConcurrency": "cmd_get_group_concurrency",
    "RemoveGroupConcurrency": "cmd_remove_group_concurrency",
    "PauseGroup": "cmd_pause_group",
    "ResumeGroup": "cmd_resume_group",
    "IsGroupPaused": "cmd_is_group_paused",
    "RateLimitGroup": "cmd_rate_limit_group",
}

# The registry's static half: which component of the engine answers each command, and with
# which of its methods. `Engine.__init__` joins each to the command's schema entry and field
# check, and binds the method once.
_PRODUCE: Final[dict[str, str]] = {"PUSH": "cmd_push", "PUSHB": "cmd_pushb"}

_CONSUME: Final[dict[str, str]] = {
    "PULL": "cmd_pull",
    "PULLB": "cmd_pullb",
    "ACK": "cmd_ack",
    "ACKB": "cmd_ackb",
    "FAIL": "cmd_fail",
    "JobHeartbeat": "cmd_job_heartbeat",
    "JobHeartbeatB": "cmd_job_heartbeat_b",
    "ExtendLock": "cmd_extend_lock",
    "ExtendLocks": "cmd_extend_locks",
}

_QUERY: Final[dict[str, str]] = {
    "GetJob": "cmd_get_job",
    "GetJobByCustomId": "cmd_get_job_by_custom_id",
    "GetState": "cmd_get_state",
    "GetResult": "cmd_get_result",
    "GetProgress": "cmd_get_progress",
    "GetJobCounts": "cmd_get_job_counts",
    "GetCountsPerPriority": "cmd_get_counts_per_priority",
    "Count": "cmd_count",
    "GetJobs": "cmd_get_jobs",
    "GetLogs": "cmd_get_logs",
}

_CONTROL: Final[dict[str, str]] = {
    "AddLog": "cmd_add_log",
    "ClearLogs": "cmd_clear_logs",
    "Progress": "cmd_progress",
    "Cancel": "cmd_cancel",
    "Discard": "cmd_discard",
    "Promote": "cmd_promote",
    "PromoteJobs": "cmd_promote_jobs",
    "MoveToWait": "cmd_move_to_wait",
    "MoveToDelayed": "cmd_move_to_delayed",
    "ChangePriority": "cmd_change_priority",
    "ChangeDelay": "cmd_change_delay",
    "Update": "cmd_update",
}

_ADMIN: Final[dict[str, str]] = {
    "Pause": "cmd_pause",
    "Resume": "cmd_resume",
    "IsPaused": "cmd_is_paused",
    "Drain": "cmd_drain",
    "Clean": "cmd_clean",
    "Obliterate": "cmd_obliterate",
    "ListQueues": "cmd_list_queues",
    "RetryCompleted": "cmd_retry_completed",
    "SetDlqConfig": "cmd_set_dlq_config",
    "GetDlqConfig": "cmd_get_dlq_config",
    "SetStallConfig": "cmd_set_stall_config",
    "GetStallConfig": "cmd_get_stall_config",
}

_INTROSPECT: Final[dict[str, str]] = {
    "GetDeduplicationJobId": "cmd_get_deduplication_job_id",
    "RemoveDeduplicationKey": "cmd_remove_deduplication_key",
    "RemoveJobDeduplicationKey": "cmd_remove_job_deduplication_key",
    "Metrics": "cmd_queue_metrics",
}

_LIMITS: Final[dict[str, str]] = {
    "RateLimit": "cmd_rate_limit",
    "RateLimitClear": "cmd_rate_limit_clear",
    "SetConcurrency": "cmd_set_concurrency",
    "ClearConcurrency": "cmd_clear_concurrency",
    "GetQueueLimits": "cmd_get_queue_limits",
}

_FLOWS: Final[dict[str, str]] = {
    "PUSHF": "cmd_pushf",
    "GetChildrenValues": "cmd_get_children_values",
    "GetFailedChildrenValues": "cmd_get_failed_children_values",
    "GetIgnoredChildrenFailures": "cmd_get_ignored_children_failures",
    "UpdateParent": "cmd_update_parent",
    "MoveToWaitingChildren": "cmd_move_to_waiting_children",
    "RemoveChildDependency": "cmd_remove_child_dependency",
    "RemoveUnprocessedChildren": "cmd_remove_unprocessed_children",
    FLOW_NOTIFY: "cmd_flow_notify",
    FLOW_RELEASE: "cmd_flow_release",
    FLOW_HELD: "cmd_flow_held",
}

_DEAD_LETTERS: Final[dict[str, str]] = {
    "Dlq": "cmd_dlq",
    "RetryDlq": "cmd_retry_dlq",
    "PurgeDlq": "cmd_purge_dlq",
    "RemoveDlqJob": "cmd_remove_dlq_job",
    "GetDlqStats": "cmd_get_dlq_stats",
}

_CRON: Final[dict[str, str]] = {
    "Cron": "cmd_cron",
    "CronGet": "cmd_cron_get",
    "CronList": "cmd_cron_list",
    "CronDelete": "cmd_cron_delete",
}

_WEBHOOKS: Final[dict[str, str]] = {
    "AddWebhook": "cmd_add_webhook",
    "RemoveWebhook": "cmd_remove_webhook",
    "ListWebhooks": "cmd_list_webhooks",
    "SetWebhookEnabled": "cmd_set_webhook_enabled",
    "WebhookSync": "cmd_webhook_sync",
}

_PARTS: Final[dict[str, dict[str, str]]] = {
    "produce": _PRODUCE,
    "consume": _CONSUME,
    "query": _QUERY,
    "control": _CONTROL,
    "admin": _ADMIN,
    "introspect": _INTROSPECT,
    "limiter": _LIMITS,
    "groups": GROUP_COMMANDS,
    "flows": _FLOWS,
    "dead_letters": _DEAD_LETTERS,
    "cron": _CRON,
    "webhooks": _WEBHOOKS,
}

COMMANDS: Final[dict[str, tuple[str, str]]] = {
    name: (part, method) for part, table in _PARTS.items() for name, method in table.items()
}
"""Every command the engine answers -> (the part that answers it, its method's name)."""

INTERNAL_COMMANDS: Final = frozenset({FLOW_NOTIFY, FLOW_RELEASE, FLOW_HELD})
"""Commands shards send each other through the front end; a client's are refused."""
