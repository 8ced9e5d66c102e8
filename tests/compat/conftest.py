"""Fixtures for the bunqueue-client compatibility tests: the real `shardq start`, random ports.

The server harness lives in `tests/runtime/shardq_harness.py`; that directory is put on
`sys.path` here so these tests can be run on their own. Every server, queue and worker a test
makes is closed (servers SIGKILLed) at teardown, whatever the test did.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from compat_clients import Clients
from shardq_harness import ShardqServer

__all__ = ["Clients", "ShardqServer"]


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """One two-shard server for a whole test module (each test uses its own queue names)."""
    server = ShardqServer(tmp_path_factory.mktemp("shared"), shards=2)
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ShardqServer]]:
    """`server_factory(shards=..., args=[...], env={...})`: a started server of this test's own;
    SIGKILLed at teardown."""
    servers: list[ShardqServer] = []

    def make(*, start: bool = True, **kwargs: Any) -> ShardqServer:
        server = ShardqServer(tmp_path / f"data{len(servers)}", **kwargs)
        servers.append(server)
        return server.start() if start else server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def qname() -> str:
    """A queue name no other test uses."""
    return f"compat-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def clients(shared_server: ShardqServer) -> Iterator[Clients]:
    """Queues and workers on the module's shared server."""
    made = Clients(shared_server)
    try:
        yield made
    finally:
        made.close()
