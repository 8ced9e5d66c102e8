"""The job-level `repeat` option: a completed job pushes its successor, delayed to the next
slot, until the chain has run `limit` times (docs/protocol.md §15.5)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from croniter import croniter

from ._bounds import cron_step_error
from ._job import Job
from ._options import is_number
from ._slots import check_zone, next_slot

__all__ = ["check_repeat", "successor"]

# Options a successor does not inherit: identities and links belong to the first job only.
_NOT_INHERITED: Final = frozenset(
    {"customId", "uniqueKey", "dedup", "dependsOn", "parentId", "childrenIds", "debounceId"}
)


def _positive(value: object) -> bool:
    return is_number(value) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def check_repeat(repeat: object) -> str | None:
    """The error for a `repeat` option that could never schedule, or None."""
    if not isinstance(repeat, Mapping):
        return "repeat must be an object"
    every, pattern = repeat.get("every"), repeat.get("pattern")
    if (every is None) == (pattern is None):
        return "repeat needs exactly one of every and pattern"
    if every is not None and not _positive(every):
        return "repeat.every must be a positive number"
    if pattern is not None:
        fields = len(pattern.split()) if isinstance(pattern, str) else 0
        if fields not in (5, 6) or not croniter.is_valid(pattern, second_at_beginning=fields == 6):
            return f"Invalid cron expression: {pattern}"
        step = cron_step_error(pattern, "repeat.pattern")
        if step is not None:
            return step
    if repeat.get("tz") is not None and not check_zone(repeat.get("tz")):
        return f"Invalid timezone: {repeat.get('tz')}"
    for key in ("limit", "endDate"):
        if repeat.get(key) is not None and not _positive(repeat.get(key)):
            return f"repeat.{key} must be a positive number"
    return None


def successor(job: Job, now: int) -> dict[str, Any] | None:
    """The PUSH fields of the job that follows `job` (just completed), or None at the end."""
    repeat: Mapping[str, Any] = job.opts["repeat"]
    count = int(repeat.get("count") or 0) + 1  # runs of the chain so far, this one included
    limit = repeat.get("limit")
    if limit is not None and count >= limit:
        return None
    if repeat.get("every") is not None:
        run_at = now + int(repeat["every"])
    else:
        schedule = {"schedule": repeat["pattern"], "timezone": repeat.get("tz")}
        run_at = next_slot(schedule, now)
    end = repeat.get("endDate")
    if end is not None and run_at > end:
        return None
    fields = {k: v for k, v in job.opts.items() if k not in _NOT_INHERITED}
    fields.update(
        data=job.data,
        name=job.name,
        priority=job.priority,
        maxAttempts=job.max_attempts,
        lifo=job.lifo,
        delay=run_at - now,
        repeat={**repeat, "count": count, "prevMillis": run_at},
    )
    return fields
