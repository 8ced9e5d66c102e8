"""The queue engine: one shard's queues in memory, driven by commands and by time.

    outcome = engine.apply(command, now, conn)   # .reply, .mutations, .events
    events, mutations = engine.tick(now)

`command` is a bunqueue command map (`{"cmd": "PUSH", "queue": ..., ...}`); the reply is the
bunqueue reply map without `reqId`. A refused command answers `{"ok": False, "error": ...}` with
bunqueue's exact message and changes nothing, except PUSHB, which keeps its accepted prefix
(past validation, which refuses the whole batch). Every field is checked against its bounds
(`_validate.py`, from the schema in `shardq/protocol/`) before a handler runs, so no value
the engine stores or schedules can overflow SQLite, msgpack or the shard's poll.
`conn` is the id of the client connection the command came from (the shard has it from the
request's envelope, never from the command map), so a closed connection's jobs can be released
with `release`.

Every entry point makes one `Outcome` (`_effects.py`) and hands it, as `fx`, to the handler
and to each method that emits a mutation or a job event; nothing of a call stays on the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from shardq.errors import CommandError

from ._control import ControlOps
from ._cron import CronOps
from ._effects import Effects, Event, Outcome
from ._flows import FLOW_HELD, FLOW_NOTIFY, FLOW_RELEASE, FlowOps
from ._group_ops import GROUP_COMMANDS, GroupOps
from ._introspect import IntrospectOps
from ._mutations import Mutation
from ._produce import ProduceOps
from ._query import QueryOps
from ._timers import TimerOps
from ._validate import CHECKED_COMMANDS, fields_checker, limits_of
from ._webhooks import WebhookOps

__all__ = ["COMMANDS", "INTERNAL_COMMANDS", "Engine"]

Handler = Callable[[Effects, Mapping[str, Any], int], dict[str, Any]]

COMMANDS: Final[dict[str, str]] = {
    "PUSH": "cmd_push",
    "PUSHB": "cmd_pushb",
    "PULL": "cmd_pull",
    "PULLB": "cmd_pullb",
    "ACK": "cmd_ack",
    "ACKB": "cmd_ackb",
    "FAIL": "cmd_fail",
    "JobHeartbeat": "cmd_job_heartbeat",
    "JobHeartbeatB": "cmd_job_heartbeat_b",
    "ExtendLock": "cmd_extend_lock",
    "ExtendLocks": "cmd_extend_locks",
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
    "Pause": "cmd_pause",
    "Resume": "cmd_resume",
    "IsPaused": "cmd_is_paused",
    "Drain": "cmd_drain",
    "Clean": "cmd_clean",
    "Obliterate": "cmd_obliterate",
    "ListQueues": "cmd_list_queues",
    "Dlq": "cmd_dlq",
    "RetryDlq": "cmd_retry_dlq",
    "PurgeDlq": "cmd_purge_dlq",
    "RetryCompleted": "cmd_retry_completed",
    "SetDlqConfig": "cmd_set_dlq_config",
    "GetDlqConfig": "cmd_get_dlq_config",
    "SetStallConfig": "cmd_set_stall_config",
    "GetStallConfig": "cmd_get_stall_config",
    "Cron": "cmd_cron",
    "CronGet": "cmd_cron_get",
    "CronList": "cmd_cron_list",
    "CronDelete": "cmd_cron_delete",
    "RateLimit": "cmd_rate_limit",
    "RateLimitClear": "cmd_rate_limit_clear",
    "SetConcurrency": "cmd_set_concurrency",
    "ClearConcurrency": "cmd_clear_concurrency",
    "GetQueueLimits": "cmd_get_queue_limits",
    **GROUP_COMMANDS,
    "AddWebhook": "cmd_add_webhook",
    "RemoveWebhook": "cmd_remove_webhook",
    "ListWebhooks": "cmd_list_webhooks",
    "SetWebhookEnabled": "cmd_set_webhook_enabled",
    "WebhookSync": "cmd_webhook_sync",
    "GetDeduplicationJobId": "cmd_get_deduplication_job_id",
    "RemoveDeduplicationKey": "cmd_remove_deduplication_key",
    "RemoveJobDeduplicationKey": "cmd_remove_job_deduplication_key",
    "RemoveDlqJob": "cmd_remove_dlq_job",
    "GetDlqStats": "cmd_get_dlq_stats",
    "Metrics": "cmd_queue_metrics",
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

INTERNAL_COMMANDS: Final = frozenset({FLOW_NOTIFY, FLOW_RELEASE, FLOW_HELD})
"""Commands shards send each other through the front end; a client's are refused."""


class Engine(
    FlowOps,
    WebhookOps,
    CronOps,
    GroupOps,
    TimerOps,
    ProduceOps,
    ControlOps,
    QueryOps,
    IntrospectOps,
):
    """One shard's queues. Pure: no I/O, no clock; `now` is milliseconds, passed in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handlers: dict[str, Handler] = {
            name: self._checked(name, getattr(self, method)) for name, method in COMMANDS.items()
        }

    def apply(self, command: Mapping[str, Any], now: int, conn: str | None = None) -> Outcome:
        """Run one command at time `now` (ms) for connection `conn` (None: no connection owns
        what it pulls). Returns its reply, mutations and job events."""
        fx = Outcome(conn)
        name = command.get("cmd")
        handler = self._handlers.get(name) if isinstance(name, str) else None
        if handler is None:
            reply: dict[str, Any] = {"ok": False, "error": f"Unknown command: {name}"}
        else:
            try:
                reply = handler(fx, command, int(now))
            except CommandError as e:
                reply = {"ok": False, "error": str(e)}
        if self.blocked:
            self.wake_limited(fx, int(now))  # an ACK or FAIL may have freed a held-back queue
        if self.group_blocked:
            self.wake_groups(fx, int(now))
        fx.reply = reply
        return fx

    def _checked(self, name: str, handler: Handler) -> Handler:
        """`handler`, behind the field bounds of its command (`_validate.py`) if it has any;
        done once here so that a command without extra checks pays nothing per call."""
        if name not in CHECKED_COMMANDS:
            return handler
        config = self.config
        limits = limits_of(config.max_key_chars, config.max_text_chars, config.max_list_items)
        check = fields_checker(name, limits)

        def checked(fx: Effects, command: Mapping[str, Any], now: int) -> dict[str, Any]:
            error = check(command)
            if error is not None:
                raise CommandError(error)
            return handler(fx, command, now)

        return checked

    def release(self, conn: str, now: int) -> tuple[int, list[Mutation], list[Event]]:
        """Release the jobs a closed connection held (no attempt charged): docs/protocol.md §2.6.
        Returns how many, and the mutations and job events that made."""
        fx = Outcome()
        released = self.release_connection(fx, conn, int(now))
        if self.blocked:
            self.wake_limited(fx, int(now))
        if self.group_blocked:
            self.wake_groups(fx, int(now))
        return released, fx.mutations, fx.events

    def supports(self, name: str) -> bool:
        return name in self._handlers
