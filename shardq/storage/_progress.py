"""Log lines for the long operation of opening a store: its schema migrations.

A migration that rewrites or indexes every row takes tens of seconds on a million jobs; the
server says what it is doing meanwhile instead of looking hung.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import structlog

__all__ = ["migration_progress", "migration_step", "schema_creation"]

_log = structlog.get_logger("shardq.storage")
T = TypeVar("T")


def migration_step(backend: str, version: int, run: Callable[[], T]) -> T:
    """Run the migration that takes the schema from `version` to `version + 1`, logged."""
    _log.info("schema_migrating", backend=backend, version=version, to=version + 1)
    started = time.perf_counter()
    result = run()
    elapsed_ms = round((time.perf_counter() - started) * 1000)
    _log.info("schema_migrated", backend=backend, version=version + 1, elapsed_ms=elapsed_ms)
    return result


def schema_creation(backend: str, version: int, run: Callable[[], T]) -> T:
    """Make a new database's schema at `version` in one step (`_schema_fresh.py`), logged."""
    started = time.perf_counter()
    result = run()
    elapsed_ms = round((time.perf_counter() - started) * 1000)
    _log.info("schema_created", backend=backend, version=version, elapsed_ms=elapsed_ms)
    return result


def migration_progress(step: str, rows: int) -> None:
    """A migration that goes through rows (`step` names what it does) has done `rows`."""
    _log.info("schema_migration_progress", step=step, rows=rows)
