"""Queue limits on the real server: a concurrency cap is never exceeded, as measured by the
handlers themselves, and a rate limit is never exceeded over 5 s; in both, workers parked in a
long-poll are woken when capacity returns (no polling: their pulls wait up to 10 s)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
WAIT_S = 30.0


class Worker(threading.Thread):
    """Pulls one job at a time with a 10 s long-poll, runs `handle`, ACKs; stops at `stop`."""

    def __init__(self, server: ShardqServer, queue: str, handle: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.conn = TcpConnection(*server.tcp_address, timeout=WAIT_S)
        self.queue, self.handle = queue, handle
        self.stop = threading.Event()
        self.started: list[int] = []

    def run(self) -> None:
        while not self.stop.is_set():
            cmd = {"cmd": "PULL", "queue": self.queue, "owner": "w", "timeout": 10_000}
            reply: dict[str, Any] = self.conn.call(cmd)
            job = reply.get("job")
            if job is None:
                continue
            self.started.append(int(job["startedAt"]))
            self.handle()
            self.conn.call({"cmd": "ACK", "id": job["id"], "token": reply["token"]})
        self.conn.close()


def test_a_concurrency_cap_is_never_exceeded(shardq_server: Factory) -> None:
    server = shardq_server(shards=1)
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def handle() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.03)
        with lock:
            running[0] -= 1

    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        conn.call({"cmd": "SetConcurrency", "queue": "capped", "limit": 3})
        conn.call({"cmd": "PUSHB", "queue": "capped", "jobs": [{"data": i} for i in range(60)]})
        workers = [Worker(server, "capped", handle) for _ in range(8)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + WAIT_S
        while conn.call({"cmd": "GetJobCounts", "queue": "capped"})["counts"]["completed"] < 60:
            assert time.monotonic() < deadline, "the capped queue did not drain"
            time.sleep(0.05)
        for w in workers:
            w.stop.set()
        conn.call({"cmd": "PUSHB", "queue": "capped", "jobs": [{"data": i} for i in range(8)]})
        for w in workers:
            w.join(WAIT_S)
    assert peak[0] == 3  # reached, never passed


def test_a_rate_limit_is_never_exceeded_over_five_seconds(shardq_server: Factory) -> None:
    server = shardq_server(shards=1)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        conn.call({"cmd": "RateLimit", "queue": "slow", "limit": 10, "duration": 1000})
        conn.call({"cmd": "PUSHB", "queue": "slow", "jobs": [{"data": i} for i in range(200)]})
        workers = [Worker(server, "slow", lambda: None) for _ in range(4)]
        for w in workers:
            w.start()
        time.sleep(5.0)
        for w in workers:
            w.stop.set()
        # The server's time just before the limit is lifted: deliveries from then on are free.
        marker = conn.call({"cmd": "PUSH", "queue": "clock", "data": None})["id"]
        cut = conn.call({"cmd": "GetJob", "id": marker})["job"]["createdAt"]
        conn.call({"cmd": "RateLimitClear", "queue": "slow"})  # lets the parked pulls return
        for w in workers:
            w.join(WAIT_S)
    starts = sorted(t for w in workers for t in w.started)
    first = starts[0]
    measured = [t for t in starts if t < min(first + 5000, cut)]
    assert len(measured) >= 40  # the window reopens on time: about 10 per second
    for at in measured:
        assert sum(1 for t in measured if at <= t < at + 1000) <= 10
