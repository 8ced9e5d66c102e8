"""The cold counts through kill -9 of the writer and the shard, on PostgreSQL: the scenario of
tests/runtime/test_cold_counts_server.py with the server's storage on a database of its own
(the counts table's triggers are PL/pgSQL there)."""

from __future__ import annotations

import sys
from pathlib import Path

from pg_server import new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer
from test_cold_counts_server import ENV, crash_scenario

from shardq.storage._postgres import PostgresStore

NEEDS_POSTGRES = True


def test_cold_counts_on_postgres_stay_exact_through_kill_9(
    tmp_path: Path, servers: list[ShardqServer]
) -> None:
    url = new_database("coldcounts")

    def start() -> ShardqServer:
        env = {**ENV, "SHARDQ_STORAGE_URL": url}
        server = ShardqServer(tmp_path / "data", shards=1, env=env)
        servers.append(server)
        return server.start()

    crash_scenario(start, lambda: PostgresStore.open(url))
