"""Log lines for the long operations of opening a store: schema migrations and their fills.

A migration that rewrites every row (the cold backlog's columns, for one) takes tens of seconds
on a million jobs; the server says what it is doing meanwhile instead of looking hung.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import structlog

__all__ = ["FILL_LOG_EVERY", "filled", "migration_step"]

_log = structlog.get_logger("shardq.storage")
T = TypeVar("T")

FILL_LOG_EVERY = 100_000
"""A fill logs its progress each time it has read this many more rows."""


def migration_step(backend: str, version: int, run: Callable[[], T]) -> T:
    """Run the migration that takes the schema from `version` to `version + 1`, logged."""
    _log.info("schema_migrating", backend=backend, version=version, to=version + 1)
    started = time.perf_counter()
    result = run()
    elapsed_ms = round((time.perf_counter() - started) * 1000)
    _log.info("schema_migrated", backend=backend, version=version + 1, elapsed_ms=elapsed_ms)
    return result


def filled(what: str, rows: int, before: int) -> None:
    """Log a fill's progress when `rows` (read so far) passed another `FILL_LOG_EVERY`."""
    if rows // FILL_LOG_EVERY > before // FILL_LOG_EVERY:
        _log.info("schema_fill_progress", what=what, rows=rows)
