"""How the CLI shows what the server answered: times, jobs and queues for a person to read.

The server speaks epoch milliseconds; a person reads local time. Every time is shown as local
ISO 8601 to the second with a relative age beside it (`2026-12-04 11:32:05 (3m ago)`), so a
glance says both when and how long ago. `--json` prints the server's values untouched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import typer

__all__ = ["ago", "job_lines", "local_time", "print_job", "short", "when"]

MAX_VALUE_CHARS: Final = 200  # data, results and errors longer than this are cut in summaries
_UNITS: Final = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def _seconds(ms: object) -> float | None:
    if isinstance(ms, bool) or not isinstance(ms, int | float) or ms != ms or ms <= 0:
        return None
    return float(ms) / 1000


def ago(ms: object, now: float | None = None) -> str:
    """`3m ago`, `in 2h` or `now` for an epoch-ms time; `-` when there is none."""
    at = _seconds(ms)
    if at is None:
        return "-"
    delta = int((time.time() if now is None else now) - at)
    size = abs(delta)
    for unit, length in _UNITS:
        if size >= length:
            amount = f"{size // length}{unit}"
            return f"{amount} ago" if delta > 0 else f"in {amount}"
    return "now"


def local_time(ms: object) -> str:
    """Local ISO 8601 to the second (`2026-12-04 11:32:05`); `-` when there is none."""
    at = _seconds(ms)
    if at is None:
        return "-"
    try:
        return datetime.fromtimestamp(at).isoformat(sep=" ", timespec="seconds")
    except (OverflowError, OSError, ValueError):  # a time no calendar holds: show the number
        return str(ms)


def when(ms: object) -> str:
    """Local time and age: `2026-12-04 11:32:05 (3m ago)`; `-` when there is none."""
    shown = local_time(ms)
    return shown if shown == "-" else f"{shown} ({ago(ms)})"


def short(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """A value as compact JSON, cut to `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def job_lines(job: Mapping[str, Any]) -> list[str]:
    """The few lines of a job a person looks at first; `--json` has the rest."""
    attempts = f"{job.get('attempts', 0)}/{job.get('maxAttempts', '?')}"
    lines = [
        f"job {job.get('id')}",
        f"  queue     {job.get('queue')}   name {job.get('name')}",
        f"  state     {job.get('state', 'active')}   attempts {attempts}"
        f"   priority {job.get('priority', 0)}",
        f"  created   {when(job.get('createdAt'))}",
    ]
    for label, key in (("runs at", "runAt"), ("started", "startedAt"),
                       ("completed", "completedAt")):  # fmt: skip
        if _seconds(job.get(key)) is not None and job.get(key) != job.get("createdAt"):
            lines.append(f"  {label:<9} {when(job.get(key))}")
    lines.append(f"  data      {short(job.get('data'))}")
    if job.get("returnvalue") is not None:
        lines.append(f"  result    {short(job.get('returnvalue'))}")
    if job.get("failedReason"):
        lines.append(f"  error     {short(job.get('failedReason'))}")
    stack: Sequence[Any] = job.get("stacktrace") or []
    lines.extend(f"    {line}" for line in stack[:5])
    return lines


def print_job(job: Mapping[str, Any]) -> None:
    typer.echo("\n".join(job_lines(job)))
