"""Bytecode for the processes a test starts, cached for the test session.

This machine's environment sets `PYTHONDONTWRITEBYTECODE=1`, so every interpreter a test
starts (the `shardq` CLI, each of a server's processes, a bench tool and its clients) compiled
shardq's source again: about 0.4 s of CPU of each server's start and stop (1.25 s with it,
0.85 s without), and 10-20 ms of each CLI run. `subprocess_bytecode` gives the processes a
module's tests start a bytecode cache under the session's temporary directory (never in the
checkout). What the processes do is unchanged; only where they find their compiled code.

Used by every test module, through tests/conftest.py: a module that starts no process only has
two variables set and put back. A server starts faster with shardq compiled once, and a test
that relied on a slow start loses its window (tests/http/test_http_lifecycle.py's `/ready is
503` test failed 3 runs in 4 with it, and 2 in 4 with bytecode cached as on most machines,
until it held the writer instead of racing it); such a test holds a process or waits for a
condition instead. A directory that must run without it overrides the fixture by its name in
its own conftest.py.

Session-scoped fixtures (tests/client's and tests/http's shared `server`) are set up before
any module's, so the server they start compiles its own bytecode, once per worker.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

__all__ = ["subprocess_bytecode"]


@pytest.fixture(scope="module", autouse=True)
def subprocess_bytecode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """For the module's tests: child interpreters write and reuse bytecode under the session's
    temporary directory. Module-scoped, so it is in place before the module's servers start,
    and it ends with the module. Without PYTHONDONTWRITEBYTECODE nothing changes (Python's own
    `__pycache__` serves); a PYTHONPYCACHEPREFIX set by the caller is kept."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYTHONDONTWRITEBYTECODE")
        if not os.environ.get("PYTHONPYCACHEPREFIX"):
            patch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path_factory.getbasetemp() / "pycache"))
        yield
