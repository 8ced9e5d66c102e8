"""Fixtures for the runtime tests: real processes, random ports, temporary directories.

`ShardqServer` and `free_port` live in `shardq_harness.py` (import them from there in a test
module); the fixtures below make sure no process outlives its test.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from shardq_harness import ShardqServer, free_port

__all__ = ["ShardqServer", "free_port"]


@pytest.fixture
def shardq_server(tmp_path: Path) -> Iterator[Callable[..., ShardqServer]]:
    """A factory: `shardq_server(shards=2, args=[...], env={...}, data_dir=...)` returns a
    started `ShardqServer` (pass `start=False` to get it unstarted). Every server it made is
    SIGKILLed at teardown if it still runs. The data dir defaults to `tmp_path / "data"`, so
    a second server in the same test reuses the first one's database."""
    servers: list[ShardqServer] = []

    def make(*, start: bool = True, data_dir: Path | None = None, **kwargs: Any) -> ShardqServer:
        server = ShardqServer(data_dir or tmp_path / "data", **kwargs)
        servers.append(server)
        return server.start() if start else server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory (ipc:// socket paths must stay under ~100 bytes, and
    pytest's tmp_path can be longer than that)."""
    with tempfile.TemporaryDirectory(prefix="sq-") as path:
        yield Path(path)
