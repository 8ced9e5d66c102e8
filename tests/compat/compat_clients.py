"""`Clients`: bunqueue-client `Queue`s and `Worker`s against one shardq server, closed together."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bunqueue import Queue, Worker
from shardq_harness import ShardqServer

__all__ = ["Clients"]


class Clients:
    """Makes bunqueue-client `Queue`s and `Worker`s against one server; closes them all."""

    def __init__(self, server: ShardqServer) -> None:
        self.server = server
        self.queues: list[Queue] = []
        self.workers: list[Worker] = []

    @property
    def address(self) -> dict[str, Any]:
        host, port = self.server.tcp_address
        return {"host": host, "port": port}

    def queue(self, name: str, **kwargs: Any) -> Queue:
        queue = Queue(name, **self.address, **kwargs)
        self.queues.append(queue)
        return queue

    def worker(self, name: str, processor: Callable[..., Any], **kwargs: Any) -> Worker:
        # Short long-polls so that close() returns quickly.
        kwargs.setdefault("poll_timeout_ms", 300)
        worker = Worker(name, processor, **self.address, **kwargs)
        self.workers.append(worker)
        worker.wait_until_ready()
        return worker

    def close(self) -> None:
        for worker in self.workers:
            worker.close(timeout=10)
        for queue in self.queues:
            queue.close()
