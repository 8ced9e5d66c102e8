"""Fixtures for the client tests: the real `shardq start`, each test over both transports
(`tcp`, `zmq`) and both client kinds (`sync`, `async`).

The server harness lives in `tests/runtime` (`shardq_harness.ShardqServer`, the
`shardq_server` factory); it is imported from there, not copied.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

_RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
if str(_RUNTIME) not in sys.path:
    sys.path.insert(0, str(_RUNTIME))

from client_helpers import Clients  # noqa: E402
from shardq_harness import ShardqServer  # noqa: E402


def _runtime_fixtures() -> Any:
    # tests/runtime/conftest.py is a module named "conftest" too; load it under its own name.
    spec = importlib.util.spec_from_file_location("runtime_fixtures", _RUNTIME / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shardq_server = _runtime_fixtures().shardq_server

TRANSPORTS = ["tcp", "zmq"]
MODES = ["sync", "async"]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """One server (2 shards) shared by the tests that need no restart; queues are unique."""
    with ShardqServer(tmp_path_factory.mktemp("shared") / "data", shards=2).start() as srv:
        yield srv
        assert srv.stop() == 0, srv.log_tail()


@pytest.fixture
def make_clients(transport: str, mode: str) -> Iterator[Callable[[ShardqServer], Clients]]:
    """`make_clients(server)`: queues and workers for that server, closed at teardown."""
    made: list[Clients] = []

    def make(srv: ShardqServer) -> Clients:
        clients = Clients(transport, mode, srv.tcp_address, srv.zmq_port)
        made.append(clients)
        return clients

    yield make
    for clients in made:
        clients.close()


@pytest.fixture
def clients(make_clients: Callable[[ShardqServer], Clients], server: ShardqServer) -> Clients:
    """Queues and workers on the shared server."""
    return make_clients(server)


@pytest.fixture(scope="session", autouse=True)
def zmq_contexts_terminate() -> Iterator[None]:
    """Fail the run if a client left a ZeroMQ socket open: the shared contexts must term."""
    yield
    for ctx in (zmq.Context.instance(), zmq.asyncio.Context.instance()):
        terminator = threading.Thread(target=ctx.term, daemon=True)
        terminator.start()
        terminator.join(10)
        assert not terminator.is_alive(), f"{ctx!r} did not terminate: a socket was left open"
