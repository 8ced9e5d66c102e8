"""What the pytest plugin starts: a real `shardq start` (`LocalServer`) and an in-process
worker thread (`ThreadWorker`). Usable without pytest too."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from shardq.client import AsyncWorker
from shardq.tasks._app import App
from shardq.tasks._dispatch import Dispatcher
from shardq.tasks._periodic import sync_schedules

__all__ = ["LocalServer", "ThreadWorker"]

READY_EVENT: Final = "shardq ready"
POLL_S: Final = 0.02


class LocalServer:
    """`shardq start` on 127.0.0.1, free ports and a temporary data directory (removed by
    `stop`). `url` is its TCP address, `zmq_url` its ZeroMQ one.

        with LocalServer().start() as server:
            app = shardq.App(url=server.url)
    """

    def __init__(self, *, shards: int = 1, data_dir: Path | None = None) -> None:
        # A short path: the server's ipc sockets live under it and must stay under 100 bytes.
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="sq-"))
        self.shards = shards
        self.tcp_port, self.zmq_port = _free_ports(2)
        self.log_path = self.data_dir / "shardq.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.tcp_port}"

    @property
    def zmq_url(self) -> str:
        return f"zmq://127.0.0.1:{self.zmq_port}"

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> LocalServer:
        """Start it and wait until it says it is ready.

        Raises:
            RuntimeError: it exited, or was not ready within `timeout` seconds (with its log).
        """
        argv = [
            sys.executable, "-m", "shardq_cli.main", "start", "--host", "127.0.0.1",
            "--tcp-port", str(self.tcp_port), "--zmq-port", str(self.zmq_port),
            "--http-port", "0",  # never the default port, which the developer's server may hold
            "--data-path", str(self.data_dir / "shardq.db"), "--shards", str(self.shards),
            "--log-format", "json",
        ]  # fmt: skip
        # The developer's own SHARDQ_* settings must not change a test's server.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"shardq start did not become ready:\n{self.log_tail()}")
            time.sleep(POLL_S)
        return self

    def _ready(self) -> bool:
        if not self.log_path.exists():
            return False
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and json.loads(line).get("event") == READY_EVENT:
                return True
        return False

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (SIGKILL after `timeout` seconds), remove the data directory; the exit
        status, or None if it never started. Idempotent."""
        code = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)
            try:
                code = self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                code = self._proc.wait()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        return code

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ThreadWorker:
    """The app's tasks served by a worker in a background thread of this process, for tests
    that enqueue with `.delay()` and wait with `.get()`. `stop()` drains like a SIGTERM."""

    def __init__(
        self, app: App, queues: Sequence[str] = (), *, concurrency: int = 4, grace: float = 5.0
    ) -> None:
        self.app = app
        self.queues = tuple(queues) or tuple(app.queues)
        self.concurrency = concurrency
        self.grace = grace
        self.counters = [0, 0]  # done, failed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: list[AsyncWorker] = []
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name="shardq-test-worker", daemon=True)
        self._error: BaseException | None = None

    def start(self) -> ThreadWorker:
        """Write the periodic tasks' schedules (as `shardq worker` does), then serve.

        Raises:
            ShardqError: the server refused a schedule, or cannot be reached.
        """
        sync_schedules(self.app, self.queues)
        self._thread.start()
        self._started.wait(10)
        return self

    def stop(self) -> None:
        """Finish the running tasks, give prefetched jobs back, stop; raise what stopped the
        worker if it failed."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            for worker in self._workers:
                asyncio.run_coroutine_threadsafe(worker.close(self.grace), loop)
        self._thread.join(self.grace + 10)
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by stop()
            self._error = e
        finally:
            self._started.set()

    async def _serve(self) -> Any:
        executor = ThreadPoolExecutor(self.concurrency * len(self.queues), "shardq-test-task")
        dispatcher = Dispatcher(self.app.tasks, executor, self.counters)
        self._workers = [
            AsyncWorker(q, dispatcher, concurrency=self.concurrency, url=self.app.url,
                        token=self.app.token, close_grace=self.grace, poll_timeout_ms=200)
            for q in self.queues
        ]  # fmt: skip
        self._loop = asyncio.get_running_loop()
        self._started.set()
        try:
            return await asyncio.gather(*(worker.run() for worker in self._workers))
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
