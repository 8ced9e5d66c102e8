"""Command names the front end needs to route: bunqueue's full list and the id-addressed ones."""

from __future__ import annotations

from typing import Final

from shardq.core import COMMANDS

__all__ = [
    "BUNQUEUE_COMMANDS",
    "ENGINE_COMMANDS",
    "ID_BATCH_COMMANDS",
    "ID_COMMANDS",
    "SHARD_COMMANDS",
]

BUNQUEUE_COMMANDS: Final = frozenset(
    # The 107 commands of the bunqueue 2.9.5 server (docs/protocol.md §14.1). A name outside
    # answers "Unknown command: X", as bunqueue does; a name inside it that shardq does not
    # implement answers "Unsupported command: X", so a client can tell the two apart.
    [
        "PUSH",
        "PUSHB",
        "PUSHF",
        "PULL",
        "PULLB",
        "ACK",
        "ACKB",
        "FAIL",
        "JobHeartbeat",
        "JobHeartbeatB",
        "ExtendLock",
        "ExtendLocks",
        "Heartbeat",
        "RegisterWorker",
        "UnregisterWorker",
        "ListWorkers",
        "GetJob",
        "GetJobByCustomId",
        "GetJobs",
        "GetState",
        "GetResult",
        "GetProgress",
        "GetJobCounts",
        "GetCountsPerPriority",
        "Count",
        "WaitJob",
        "GetLogs",
        "AddLog",
        "ClearLogs",
        "GetChildrenValues",
        "GetFailedChildrenValues",
        "GetIgnoredChildrenFailures",
        "GetQueueLimits",
        "GetDeduplicationJobId",
        "Cancel",
        "Discard",
        "Promote",
        "PromoteJobs",
        "MoveToWait",
        "MoveToDelayed",
        "MoveToWaitingChildren",
        "ChangePriority",
        "ChangeDelay",
        "Update",
        "UpdateParent",
        "Progress",
        "RemoveChildDependency",
        "RemoveUnprocessedChildren",
        "RemoveDeduplicationKey",
        "RemoveJobDeduplicationKey",
        "Pause",
        "Resume",
        "IsPaused",
        "Drain",
        "Obliterate",
        "Clean",
        "ListQueues",
        "Dlq",
        "GetDlqStats",
        "RetryDlq",
        "PurgeDlq",
        "RemoveDlqJob",
        "RetryCompleted",
        "SetDlqConfig",
        "GetDlqConfig",
        "RateLimit",
        "RateLimitClear",
        "SetConcurrency",
        "ClearConcurrency",
        "SetStallConfig",
        "GetStallConfig",
        "GetGroupJobsCount",
        "GetGroupActiveCount",
        "SetGroupRateLimit",
        "GetGroupRateLimit",
        "RemoveGroupRateLimit",
        "GetGroupRateLimitTtl",
        "SetGroupConcurrency",
        "GetGroupConcurrency",
        "RemoveGroupConcurrency",
        "PauseGroup",
        "ResumeGroup",
        "IsGroupPaused",
        "RateLimitGroup",
        "GetGroupsJobsCount",
        "Cron",
        "CronGet",
        "CronList",
        "CronDelete",
        "Ping",
        "Hello",
        "Auth",
        "Stats",
        "Metrics",
        "TrimEvents",
        "Prometheus",
        "StorageStatus",
        "CompactMemory",
        "AddWebhook",
        "RemoveWebhook",
        "ListWebhooks",
        "SetWebhookEnabled",
        "DashboardOverview",
        "DashboardQueues",
        "DashboardQueue",
        "SubscribeEvents",
        "UnsubscribeEvents",
    ]
)

ENGINE_COMMANDS: Final = frozenset(COMMANDS)
"""What `Engine.apply` implements."""

SHARD_COMMANDS: Final = ENGINE_COMMANDS | {"WaitJob", "Stats"}
"""What a shard answers: the engine's commands plus the two the shard adds itself."""

ID_COMMANDS: Final = frozenset(
    [
        "GetJob",
        "GetState",
        "GetResult",
        "GetJobByCustomId",
        "GetProgress",
        "GetLogs",
        "AddLog",
        "Progress",
        "ACK",
        "FAIL",
        "JobHeartbeat",
        "ExtendLock",
        "Cancel",
        "Discard",
        "Promote",
        "MoveToWait",
        "MoveToDelayed",
        "ChangePriority",
        "ChangeDelay",
        "Update",
        "ClearLogs",
        "WaitJob",
        "RemoveJobDeduplicationKey",
    ]
)
"""Commands that name one job (by `id`, or `customId` for GetJobByCustomId) and no queue."""

ID_BATCH_COMMANDS: Final = frozenset({"ACKB", "JobHeartbeatB", "ExtendLocks"})
"""Commands that name many jobs by `ids`, with arrays aligned to it."""
