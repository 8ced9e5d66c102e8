"""The storage backends the contract suite runs against, one class each.

A backend here knows how to open its store at a place of its own, empty at first. Adding a
backend (PostgreSQL) is one class below and one entry in `BACKENDS`; every test of the suite
then runs against it too. Backend-specific knowledge the suite needs (its latest schema
version, how to build a store at an older version, whether it can cap its size) lives here
and nowhere in the tests.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from unittest import mock

from pg_server import postgres_wanted, shared_server

from shardq.storage import Storage, Store, _schema, _store_loads


class Backend(Protocol):
    """One backend, at one place (a file, a database) that only this test uses."""

    name: str

    @property
    def latest_version(self) -> int:
        """The schema version a store opened by this code is at."""
        ...

    @property
    def cold_version(self) -> int:
        """The schema version that added the cold columns."""
        ...

    @property
    def counts_version(self) -> int:
        """The schema version that keeps the cold counts in a table (`_cold_count_table`)."""
        ...

    @property
    def stale_page(self) -> int:
        """The most row keys one list of `stale_completed` may hold."""
        ...

    def open(self) -> Storage:
        """Open (creating and migrating it if needed) the store at this backend's place."""
        ...

    def open_at_version(self, version: int) -> Storage:
        """Open the store at this place migrated only up to `version` (0: no schema yet)."""
        ...

    def fresh(self) -> Backend:
        """The same backend at another, empty place (a property test needs one per example)."""
        ...


class CappedBackend(Backend, Protocol):
    """A backend that can cap its own size (a server's disk is its operator's: PostgreSQL
    has no such cap, and joins `BACKENDS` only)."""

    def open_capped(self, max_bytes: int) -> Storage:
        """Open the store at this place with a size cap of about `max_bytes`."""
        ...


class SqliteBackend:
    """The embedded SQLite `Store`: one file per place, in a test's temporary directory."""

    name = "sqlite"

    def __init__(self, directory: Path, counter: itertools.count[int] | None = None) -> None:
        self._directory = directory
        self._counter = counter if counter is not None else itertools.count()
        self.path = directory / f"shardq-{next(self._counter)}.db"

    @property
    def latest_version(self) -> int:
        return len(_schema.MIGRATIONS)

    @property
    def cold_version(self) -> int:
        return _schema.COLD_VERSION

    @property
    def counts_version(self) -> int:
        return _schema.COUNTS_VERSION

    @property
    def stale_page(self) -> int:
        return _store_loads.STALE_PAGE

    def open(self) -> Storage:
        return Store.open(self.path)

    def open_at_version(self, version: int) -> Storage:
        # The migrations are a list the store walks on open: the first `version` of them is
        # exactly what a shardq of that schema version created.
        with mock.patch.object(_schema, "MIGRATIONS", _schema.MIGRATIONS[:version]):
            return Store.open(self.path)

    def open_capped(self, max_bytes: int) -> Storage:
        return Store.open(self.path, max_bytes=max_bytes)

    def fresh(self) -> Backend:
        return SqliteBackend(self._directory, self._counter)


class PostgresBackend:
    """`PostgresStore` on this test process's PostgreSQL server (tests/storage/pg_server.py,
    started on first use): one schema per place, so a place costs a CREATE SCHEMA rather
    than a CREATE DATABASE. The directory is not used."""

    name = "postgres"

    def __init__(self, directory: Path | None = None) -> None:
        self.url = shared_server().url()
        self.schema = f"place_{uuid.uuid4().hex[:16]}"

    @property
    def latest_version(self) -> int:
        from shardq.storage import _pg_schema

        return len(_pg_schema.MIGRATIONS)

    @property
    def cold_version(self) -> int:
        from shardq.storage import _pg_schema

        return _pg_schema.COLD_VERSION

    @property
    def counts_version(self) -> int:
        from shardq.storage import _pg_schema

        return _pg_schema.COUNTS_VERSION

    @property
    def stale_page(self) -> int:
        from shardq.storage import _postgres

        return _postgres.STALE_PAGE

    def open(self) -> Storage:
        from shardq.storage._postgres import PostgresStore

        return PostgresStore.open(self.url, schema=self.schema)

    def open_at_version(self, version: int) -> Storage:
        from shardq.storage import _pg_schema

        with mock.patch.object(_pg_schema, "MIGRATIONS", _pg_schema.MIGRATIONS[:version]):
            return self.open()

    def fresh(self) -> Backend:
        return PostgresBackend()


# Name -> how to make the backend in a test's temporary directory. A backend that needs a
# server (PostgreSQL) starts it once per test process and gives each test a place of its own.
# SHARDQ_TEST_POSTGRES=0 leaves PostgreSQL out (a developer without it installed); otherwise
# a machine without it fails those tests, saying what to install.
BACKENDS: dict[str, Callable[[Path], Backend]] = {
    "sqlite": SqliteBackend,
}
if postgres_wanted():
    BACKENDS["postgres"] = PostgresBackend

# The backends with a size cap of their own, for the disk-full tests.
CAPPED_BACKENDS: dict[str, Callable[[Path], CappedBackend]] = {
    "sqlite": SqliteBackend,
}
