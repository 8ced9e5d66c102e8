"""Queue-wide commands on a cold backlog of 20,000 jobs, on PostgreSQL: the scenario of
tests/runtime/test_wide_cold_server.py (answers as pushed, the shard at about a head) with
the shard's reads on a PostgreSQL connection of its own; and its Drains of a cold backlog with
uniqueKeys and custom ids (the writer's range deletion on PostgreSQL)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from pg_server import new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer
from test_wide_cold_server import HEAD, drain_scenario, wide_scenario

NEEDS_POSTGRES = True


def _starter(tmp_path: Path, servers: list[ShardqServer], name: str) -> Callable[[], ShardqServer]:
    url = new_database(name)
    env = {"SHARDQ_STORAGE_URL": url, "SHARDQ_ENGINE_HEAD_JOBS": str(HEAD)}

    def start() -> ShardqServer:
        server = ShardqServer(tmp_path / f"run{len(servers)}", shards=1, env=env)
        servers.append(server)
        return server.start()

    return start


def test_queue_wide_commands_on_postgres_hold_about_a_head(
    tmp_path: Path, servers: list[ShardqServer]
) -> None:
    wide_scenario(_starter(tmp_path, servers, "wide"))


def test_a_drained_cold_backlog_on_postgres_frees_its_keys_and_stays_drained(
    tmp_path: Path, servers: list[ShardqServer]
) -> None:
    drain_scenario(_starter(tmp_path, servers, "drain"))
