"""Fixtures for the HTTP port's tests: one real server with HTTP on a random port, shared by the
modules of this directory (each uses queues of its own; counters are compared as deltas)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
if str(_RUNTIME) not in sys.path:
    sys.path.insert(0, str(_RUNTIME))

from shardq_harness import ShardqServer, free_port  # noqa: E402


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """Two shards, so per-queue answers come from a fan-out; stopped cleanly at the end."""
    data = tmp_path_factory.mktemp("http") / "data"
    # 90 s: five processes start slowly on a loaded 2-core machine.
    with ShardqServer(data, shards=2, http_port=free_port()).start(timeout=90) as srv:
        yield srv
        assert srv.stop() == 0, srv.log_tail()
