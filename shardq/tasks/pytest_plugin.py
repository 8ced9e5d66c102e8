"""The pytest plugin (registered as `shardq` under the `pytest11` entry point).

Fixtures:

- `shardq_server` (session): a real `shardq start` on 127.0.0.1, free ports, a temporary data
  directory; stopped and removed after the session. `.url` is its `tcp://` address.
- `shardq_app`: a fresh `shardq.App` bound to that server; register tasks on it in a test,
  or point your own app at it with `shardq_server.url`.
- `shardq_worker`: a factory, `shardq_worker(app)`, that serves the app's tasks from a
  thread of the test process until the test ends.

For unit tests without a server, use `App(eager=True)`: `.delay()` runs the task at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from shardq.tasks import App
    from shardq.tasks._testing import LocalServer, ThreadWorker

__all__ = ["shardq_app", "shardq_server", "shardq_worker"]


@pytest.fixture(scope="session")
def shardq_server() -> Iterator[LocalServer]:
    """A running shardq server for the whole session (one shard)."""
    # Imported here: every pytest run loads the plugin; only tests that use it pay.
    from shardq.tasks._testing import LocalServer

    with LocalServer().start() as server:
        yield server


@pytest.fixture
def shardq_app(shardq_server: LocalServer) -> Iterator[App]:
    """An `App` on `shardq_server`, closed after the test."""
    from shardq.tasks import App

    with App(url=shardq_server.url) as app:
        yield app


@pytest.fixture
def shardq_worker() -> Iterator[Callable[..., ThreadWorker]]:
    """`shardq_worker(app, queues=(), concurrency=4)`: a started `ThreadWorker`, stopped
    (running tasks finished) after the test."""
    from shardq.tasks._testing import ThreadWorker

    started: list[ThreadWorker] = []

    def make(app: App, *args: Any, **kwargs: Any) -> ThreadWorker:
        worker = ThreadWorker(app, *args, **kwargs).start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()
