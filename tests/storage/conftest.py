"""Fixtures shared by the storage suites: the PostgreSQL test server's lifetime, and the
shardq servers a test starts on it (`servers`).

tests/storage goes on `sys.path` for `pg_server` (the suites below import it, and later ones
elsewhere can put this directory on their path the same way), and tests/runtime for the
`shardq_harness`. The PostgreSQL server starts on the first test that needs it and stops when
the session ends.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from pg_server import postgres_wanted, stop_shared_server
from shardq_harness import ShardqServer


@pytest.fixture(scope="session", autouse=True)
def _stop_postgres() -> Iterator[None]:
    """Stop the PostgreSQL server, if a test started one, when the session ends."""
    yield
    stop_shared_server()


@pytest.fixture
def servers() -> Iterator[list[ShardqServer]]:
    """The shardq servers a test appends as it starts them (several, or one started again
    after a kill), each closed when the test ends, passed or not."""
    made: list[ShardqServer] = []
    yield made
    for server in made:
        server.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (not skip) the tests of modules that set `NEEDS_POSTGRES = True` when
    SHARDQ_TEST_POSTGRES=0: a developer without PostgreSQL leaves them out on purpose, and
    everywhere else a missing PostgreSQL fails them (`pg_server.find_bindir`)."""
    if postgres_wanted():
        return
    keep = [i for i in items if not getattr(getattr(i, "module", None), "NEEDS_POSTGRES", False)]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
