"""Logging for shardq's processes (`shardq start`, `shardq worker`): structlog, one line per
event, on stderr.

It sits at the bottom of the package (it imports nothing from shardq), so the server's
runtime and the task worker share it without one importing the other.

Only entry points call `configure` (the CLI, the supervisor, a child's `main`); library code
just calls `structlog.get_logger()` and logs events with bound context.

Every line on stderr must parse as JSON in the default format, because operators and tests feed
stderr to a log pipeline. So `configure` also routes what would otherwise bypass structlog (an
uncaught exception's traceback, a Python warning, a stdlib `logging` record) through it.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import MutableMapping
from types import TracebackType
from typing import Any, TextIO

import structlog

__all__ = ["configure"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
# The keys every line starts with, in this order, so a human reading raw JSON finds them.
_HEAD = ("timestamp", "level", "event", "role", "pid")

EventDict = MutableMapping[str, Any]


def configure(
    role: str,
    fmt: str = "json",
    level: str = "info",
    index: int | None = None,
    *,
    stream: TextIO | None = None,
) -> None:
    """Send structlog events at `level` and above to `stream` (stderr) as `fmt` lines.

    `role` is "supervisor", "frontend", "shard" or "writer"; with `index` it becomes e.g.
    "shard-3". `fmt` is "json" (one JSON object per line) or "console" (structlog's
    `ConsoleRenderer`). Every event carries `timestamp` (ISO 8601, UTC), `level`, `event`,
    `role` and `pid`. "auto" is console on a terminal and JSON otherwise (a child's spec
    holds the config's default, "auto", unless the supervisor resolved it). Raises
    `ValueError` for an unknown `fmt` or `level`.
    """
    out = sys.stderr if stream is None else stream
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    if fmt not in ("json", "console"):
        raise ValueError(f"unknown log format {fmt!r}: expected json or console")
    if level not in _LEVELS:
        raise ValueError(f"unknown log level {level!r}: expected one of {', '.join(_LEVELS)}")
    identity = {"role": role if index is None else f"{role}-{index}", "pid": os.getpid()}

    def add_identity(_logger: Any, _method: str, event: EventDict) -> EventDict:
        for key, value in identity.items():
            event.setdefault(key, value)
        return event

    if fmt == "json":
        # No locals in tracebacks: they would put job payloads and tokens into the logs.
        tracebacks = structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        )
        tail: list[Any] = [tracebacks, _head_first, structlog.processors.JSONRenderer()]
    else:
        renderer = structlog.dev.ConsoleRenderer(
            colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
        tail = [renderer]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_identity,
            *tail,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # One write per line: children share the supervisor's stderr, and a line written in
        # two pieces could interleave with another process's line.
        logger_factory=structlog.WriteLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    _capture_strays(_LEVELS[level])


def _head_first(_logger: Any, _method: str, event: EventDict) -> EventDict:
    head = {key: event.pop(key) for key in _HEAD if key in event}
    head.update(event)
    return head


class _ToStructlog(logging.Handler):
    """Forwards stdlib `logging` records (from a dependency) to structlog."""

    def emit(self, record: logging.LogRecord) -> None:
        log = structlog.get_logger(record.name)
        log.log(record.levelno, record.getMessage(), logger=record.name)


def _capture_strays(level: int) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_ToStructlog()]
    root.setLevel(level)
    sys.excepthook = _log_uncaught

    def show_warning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        structlog.get_logger().warning(
            "python warning",
            message=str(message),
            category=category.__name__,
            location=f"{filename}:{lineno}",
        )

    warnings.showwarning = show_warning


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    structlog.get_logger().critical("uncaught exception", exc_info=(kind, exc, tb))
