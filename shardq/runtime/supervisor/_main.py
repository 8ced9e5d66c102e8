"""`shardq start`'s entry into the supervisor: the configuration resolved once (its log
format, the node's names), logging configured, scheduled backups started, then `Supervisor`."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import structlog

from shardq.backup._schedule import scheduled_backups
from shardq.runtime._config import ConfigError, load_config, resolve_node
from shardq.runtime._logging import configure
from shardq.runtime.supervisor._process import EXIT_CONFIG, Supervisor

__all__ = ["main", "resolve_log_format"]

log = structlog.get_logger()


def resolve_log_format(fmt: object) -> object:
    """`auto` (or no choice) becomes console lines on a terminal and JSON otherwise."""
    if fmt in (None, "auto"):
        return "console" if sys.stderr.isatty() else "json"
    return fmt


def main(
    config_file: str | os.PathLike[str] | None = None,
    flags: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """`shardq start`: resolve the config, configure logging, run the supervisor.

    Returns the exit code: 0 after a clean shutdown, 1 on a failure (logged), 2 for a bad
    configuration (logged, naming the key).
    """
    try:
        config = load_config(config_file, env=env, flags=flags)
    except ConfigError as e:
        requested = resolve_log_format((flags or {}).get("log_format"))
        configure("supervisor", requested if requested in ("json", "console") else "json")
        log.error("invalid configuration", error=str(e))
        return EXIT_CONFIG
    # Resolved here, once: the children write to the supervisor's stderr, and must agree.
    config = config.with_keys(log_format=str(resolve_log_format(config.process.log_format)))
    config = resolve_node(config)  # the node's names, one for all its processes
    configure("supervisor", config.process.log_format, config.process.log_level)
    try:
        backups = scheduled_backups(
            Path(config.supervisor.data_path), env, external_store=bool(config.writer.storage_url)
        )
    except ValueError as e:
        log.error("invalid configuration", error=str(e))
        return EXIT_CONFIG
    try:
        return Supervisor(config).run()
    finally:
        if backups is not None:
            backups.stop()
