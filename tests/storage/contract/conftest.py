"""Fixtures of the storage contract suite: every test runs once per backend in `BACKENDS`.

The PostgreSQL backend's server (tests/storage/pg_server.py) is started by the first test
that needs it and stopped by tests/storage/conftest.py when the session ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_backends import BACKENDS, CAPPED_BACKENDS, Backend, CappedBackend

from shardq.storage import Storage


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
