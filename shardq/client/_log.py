"""Where the SDK's log lines go: the application's logging if it set one up, else JSON on stderr.

A library must not configure logging for its application, and must not print on stdout (the
application's output). So each `Worker` picks its logger when it is made:
- the application configured structlog: the SDK's events go through that configuration;
- it configured the standard `logging` module (a handler on the root logger or on
  `shardq.client`): they go to the `shardq.client` logger, the fields written into the message
  and also passed as `extra={"shardq": {...}}`;
- neither: one JSON object a line on stderr, at info and above, without touching any global.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Final

import structlog

__all__ = ["LOGGER_NAME", "client_logger"]

LOGGER_NAME: Final = "shardq.client"
EventDict = MutableMapping[str, Any]


class _StderrLogger:
    """Writes each rendered line to the current `sys.stderr` (it may be replaced later)."""

    def msg(self, message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def _stdlib_call(
    _logger: Any, _method: str, event: EventDict
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call to make on a `logging.Logger`: a readable message, and the fields as extra."""
    name = event.pop("event", "")
    event.pop("level", None)
    fields = " ".join(f"{key}={value!r}" for key, value in event.items())
    return ((f"{name} {fields}" if fields else str(name)),), {"extra": {"shardq": dict(event)}}


def _head_first(_logger: Any, _method: str, event: EventDict) -> EventDict:
    head = {key: event.pop(key) for key in ("timestamp", "level", "event") if key in event}
    return {**head, "logger": LOGGER_NAME, **event}


def _stdlib_configured(std: logging.Logger) -> bool:
    return bool(std.handlers or logging.getLogger().handlers)


def client_logger() -> Any:
    """A structlog logger for the SDK, following the rules of the module docstring."""
    if structlog.is_configured():
        return structlog.get_logger(LOGGER_NAME)
    std = logging.getLogger(LOGGER_NAME)
    if _stdlib_configured(std):
        return structlog.wrap_logger(
            std, processors=[_stdlib_call], wrapper_class=structlog.stdlib.BoundLogger
        )
    return structlog.wrap_logger(
        _StderrLogger(),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _head_first,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    )
