"""Periodic tasks: `@app.periodic(...)` records a schedule; `shardq worker` upserts it.

    @app.periodic("*/5 * * * *", tz="Europe/Paris")
    @app.task(queue="reports")
    def report() -> None: ...

    @app.periodic(every=30)          # seconds
    @app.task
    def heartbeat() -> None: ...

Each schedule is one of the server's cron schedules (docs/protocol.md §15), named after the
task, so there is no beat process: the server fires the slots, at most once each (the slot
handled is committed with the job it pushed, restarts included). Every worker that starts
writes the schedules of its queues: replacing a schedule keeps the slot it handled last, so
any number of workers may start at once, and a changed schedule (new expression, arguments or
options) takes effect at the next start. An `every` schedule's grid starts again from that
moment (the server does not fire a slot less than 0.8 intervals after the last one).
"""

from __future__ import annotations

import math
import threading
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardq.client import Connection, is_transient
from shardq.errors import ShardqError
from shardq.tasks._options import encode_payload

if TYPE_CHECKING:
    from shardq.tasks._app import App, Task

__all__ = ["Schedule", "ScheduleWriter", "sync_schedules"]

RETRY_FIRST_S = 0.5  # first pause before writing the schedules again; doubles up to the next
RETRY_MAX_S = 5.0


def _log() -> Any:
    """The tasks' logger. structlog (and croniter, below) are imported when a worker writes
    schedules or an app declares a cron: a web application that only sends tasks imports
    `shardq.tasks` without them (tests/test_import_boundary.py)."""
    import structlog

    return structlog.get_logger("shardq.tasks")


# The task options a schedule's jobs keep (the server passes these on, docs/protocol.md §15.1).
_JOB_OPTIONS = ("maxAttempts", "backoff", "timeout")


@dataclass(frozen=True)
class Schedule:
    """When a task runs by itself: a cron expression (5 fields, or 6 with seconds first) read
    in `tz`, or every `every` seconds; called with `args` and `kwargs`."""

    cron: str | None = None
    tz: str | None = None
    every: float | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ValueError("periodic() takes a cron expression or every=<seconds>, not both")
        if self.cron is not None:
            from croniter import croniter

            fields = self.cron.split() if isinstance(self.cron, str) else []
            if len(fields) not in (5, 6) or not croniter.is_valid(
                self.cron, second_at_beginning=len(fields) == 6
            ):
                raise ValueError(f"invalid cron expression: {self.cron!r}")
        if self.every is not None:
            ok = isinstance(self.every, int | float) and not isinstance(self.every, bool)
            if not ok or not math.isfinite(self.every) or round(self.every * 1000) < 1:
                raise ValueError(f"every must be a number of seconds > 0, got {self.every!r}")
            if self.tz is not None:
                raise ValueError("tz applies to a cron expression, not to every=")
        if self.tz is not None:
            try:
                zoneinfo.ZoneInfo(self.tz)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError) as e:
                raise ValueError(f"unknown time zone: {self.tz!r}") from e

    def command(self, task: Task[..., Any]) -> dict[str, Any]:
        """The `Cron` command of this schedule for `task`."""
        opts = task.options
        wire = opts.job_options(self.args, self.kwargs, None).to_wire()
        cmd: dict[str, Any] = {
            "cmd": "Cron",
            "name": task.name,
            "queue": opts.queue,
            "jobName": task.name,
            "data": encode_payload(task.name, self.args, self.kwargs),
            "priority": opts.priority or 0,
            "jobOptions": {k: v for k, v in wire.items() if k in _JOB_OPTIONS},
        }
        if self.cron is not None:
            cmd["schedule"] = self.cron
            cmd["timezone"] = self.tz or "UTC"
        else:
            cmd["repeatEvery"] = round(self.every * 1000) if self.every is not None else None
        return cmd


def sync_schedules(app: App, queues: Sequence[str], url: str | None = None) -> list[str]:
    """Create or replace the schedule of every periodic task on `queues` (on the server at
    `url`, the app's by default); their names.

    Raises:
        ServerError: the server refused a schedule (its message names the problem).
        ConnectionLost, CommandTimeout: as `Connection.call` raises them.
    """
    due = [(n, s) for n, s in sorted(app.schedules.items())
           if app.tasks[n].options.queue in queues]  # fmt: skip
    if not due:
        return []
    with Connection(url or app.url, token=app.token, timeout=app.timeout) as conn:
        for name, schedule in due:
            conn.call(schedule.command(app.tasks[name]))
    return [name for name, _ in due]


class ScheduleWriter:
    """Writes the schedules for `shardq worker`: once at start, and while the server cannot be
    reached (a worker started before its server), again in a background thread with a growing
    pause, as the workers themselves keep trying to connect."""

    def __init__(self, app: App, queues: Sequence[str], url: str | None) -> None:
        self._app = app
        self._queues = tuple(queues)
        self._url = url
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self) -> bool:
        """One attempt; False after a transient failure (logged), True once written.

        Raises:
            ServerError: the server refused a schedule (a permanent error).
        """
        try:
            written = sync_schedules(self._app, self._queues, self._url)
        except ShardqError as e:
            if not is_transient(e):
                raise
            _log().warning("cannot write the periodic tasks' schedules yet; retrying",
                           error=f"{type(e).__name__}: {e}")  # fmt: skip
            return False
        if written:
            _log().info("schedules written", tasks=written)
        return True

    def keep_trying(self) -> None:
        """Retry `write` in a daemon thread until it succeeds, a refusal, or `stop`."""
        self._thread = threading.Thread(target=self._retry, name="shardq-schedules", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(RETRY_MAX_S)

    def _retry(self) -> None:
        pause = RETRY_FIRST_S
        while not self._stop.wait(pause):
            try:
                if self.write():
                    return
            except ShardqError as e:
                _log().error("the server refused the periodic tasks' schedules",
                             error=f"{type(e).__name__}: {e}")  # fmt: skip
                return
            pause = min(2 * pause, RETRY_MAX_S)
