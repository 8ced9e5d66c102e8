"""Queue-wide commands on a cold backlog of 20,000 jobs, on PostgreSQL: the scenario of
tests/runtime/test_wide_cold_server.py (answers as pushed, the shard at about a head) with
the shard's reads on a PostgreSQL connection of its own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_server import new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer
from test_wide_cold_server import HEAD, wide_scenario

NEEDS_POSTGRES = True


@pytest.fixture
def servers() -> Iterator[list[ShardqServer]]:
    made: list[ShardqServer] = []
    yield made
    for server in made:
        server.close()


def test_queue_wide_commands_on_postgres_hold_about_a_head(
    tmp_path: Path, servers: list[ShardqServer]
) -> None:
    url = new_database("wide")
    env = {"SHARDQ_STORAGE_URL": url, "SHARDQ_ENGINE_HEAD_JOBS": str(HEAD)}

    def start() -> ShardqServer:
        server = ShardqServer(tmp_path / f"run{len(servers)}", shards=1, env=env)
        servers.append(server)
        return server.start()

    wide_scenario(start)
