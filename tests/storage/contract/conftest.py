"""Fixtures of the storage contract suite: every test runs once per backend in `BACKENDS`.

tests/storage goes on `sys.path` for `pg_server`, the PostgreSQL test server (started on
first use, stopped when the session ends).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pg_server import stop_shared_server
from storage_backends import BACKENDS, CAPPED_BACKENDS, Backend, CappedBackend

from shardq.storage import Storage


@pytest.fixture(scope="session", autouse=True)
def _stop_postgres() -> Iterator[None]:
    """Stop the PostgreSQL server, if a test started one, when the session ends."""
    yield
    stop_shared_server()


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A backend at an empty place of its own."""
    make = BACKENDS[request.param]
    return make(tmp_path)


@pytest.fixture(params=sorted(CAPPED_BACKENDS))
def capped_backend(request: pytest.FixtureRequest, tmp_path: Path) -> CappedBackend:
    """A backend that can cap its size, at an empty place of its own."""
    make = CAPPED_BACKENDS[request.param]
    return make(tmp_path)


@pytest.fixture
def storage(backend: Backend) -> Iterator[Storage]:
    """The backend's store, opened (so migrated) and empty; closed after the test."""
    with backend.open() as store:
        yield store
