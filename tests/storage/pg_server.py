"""The PostgreSQL server the tests share: `shared_server()`, one per test process.

The server itself is `bench._pg_server.PostgresServer` (a throwaway cluster bound to
127.0.0.1 on a free port, run as the `postgres` user when we are root). Tests take a schema or
a database of their own on the shared one; tests/storage/conftest.py stops it when the session
ends. Suites elsewhere (the cluster's) put tests/storage on `sys.path` and import this module.

Without PostgreSQL's binaries, `shared_server()` raises saying what to install, so the tests
that need it fail. A developer without PostgreSQL sets SHARDQ_TEST_POSTGRES=0 to deselect them
(docs/postgres.md).
"""

from __future__ import annotations

import atexit
import os
import uuid

import psycopg

from bench._pg_server import PostgresServer, find_bindir

__all__ = [
    "POSTGRES_ENV",
    "PostgresServer",
    "find_bindir",
    "lease_owners",
    "new_database",
    "postgres_wanted",
    "shared_server",
    "stop_shared_server",
]

POSTGRES_ENV = "SHARDQ_TEST_POSTGRES"
"""Set to 0 to leave the PostgreSQL tests out (locally, without PostgreSQL installed)."""

# Durability across a crash of the *server* is not what the tests check (they kill shardq's
# processes, never PostgreSQL), so fsync is off to spare the shared machine's disk.
TEST_SETTINGS = ("fsync=off", "full_page_writes=off", "max_connections=100")


def postgres_wanted() -> bool:
    """Whether the PostgreSQL tests run (anything but SHARDQ_TEST_POSTGRES=0)."""
    return os.environ.get(POSTGRES_ENV, "1").strip() != "0"


_shared: PostgresServer | None = None


def shared_server() -> PostgresServer:
    """This process's one test server, started on first use and stopped at exit at the
    latest (`stop_shared_server` stops it sooner)."""
    global _shared
    if _shared is None:
        server = PostgresServer(TEST_SETTINGS)
        try:
            server.start()
        except BaseException:
            server.stop()
            raise
        _shared = server
        atexit.register(stop_shared_server)
    return _shared


def new_database(prefix: str) -> str:
    """A fresh, empty database on the shared server, named `<prefix>_<random>`: its URL."""
    pg = shared_server()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg.url(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return pg.url(name)


def stop_shared_server() -> None:
    """Stop the shared server if one was started."""
    global _shared
    if _shared is not None:
        _shared.stop()
        _shared = None


def lease_owners(url: str) -> dict[int, str]:
    """{partition: node id} of the partition leases that have not expired, on the database
    at `url` (the cluster tests' view of who holds what)."""
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT partition, owner FROM partition_leases WHERE expires_at > now()"
        ).fetchall()
    return {int(p): str(o) for p, o in rows}
