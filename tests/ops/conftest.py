"""Fixtures for the operations tests (admin CLI, backups, TLS): the real `shardq start` and
the real `shardq` entry point (`ops_helpers.run_cli`), run as subprocesses.

The server harness lives in `tests/runtime` (`shardq_harness.ShardqServer`); it is imported
from there, not copied.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
if str(_RUNTIME) not in sys.path:
    sys.path.insert(0, str(_RUNTIME))

from shardq_harness import ShardqServer  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """A started one-shard server, shared by a module's tests (each uses queues of its own: a
    start costs more than most of these tests), SIGKILLed at teardown if it still runs."""
    with ShardqServer(tmp_path_factory.mktemp("server") / "data", shards=1).start() as srv:
        yield srv
