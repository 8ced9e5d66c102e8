"""Deploy restart: rolling SIGTERM restarts under live pushes lose nothing.

A producer pushes without pause (buffered and durable, to queues on both shards), reconnecting
after each restart; meanwhile the server is stopped with SIGTERM and started again
RESTARTS times (8 by default, `SHARDQ_ADVERSARIAL_RESTARTS` for more). A graceful stop writes
everything it answered, so every push answered ok, buffered ones included, must be there
afterwards, exactly once. State set up before the first restart round-trips: waiting jobs, a
stored result, a paused queue, and a DLQ entry that can still be retried.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from shardq_harness import ShardqServer, poll_until

from shardq.client import ClientError, TcpConnection

RESTARTS = int(os.environ.get("SHARDQ_ADVERSARIAL_RESTARTS", "8"))
MIN_PUSHES_BETWEEN = 10  # every restart lands in a live stream
TIMEOUT_S = 30.0


def call(c: TcpConnection, **cmd: Any) -> dict[str, Any]:
    return c.call(cmd, check=False)


class Producer(threading.Thread):
    """Pushes until `halt`; keeps the ids of every push answered ok."""

    def __init__(self, server: ShardqServer) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.halt = threading.Event()
        self.acked: list[str] = []
        self.refused = 0
        self.cut = 0  # pushes whose connection broke before the answer: maybe stored, unknown
        self.lock = threading.Lock()

    def run(self) -> None:
        n = 0
        deadline = time.monotonic() + TIMEOUT_S * (RESTARTS + 2)
        while not self.halt.is_set() and time.monotonic() < deadline:
            try:
                c = TcpConnection(*self.server.tcp_address, timeout=TIMEOUT_S)
            except (ClientError, OSError):
                self.halt.wait(0.05)  # the server is restarting
                continue
            try:
                while not self.halt.is_set():
                    n += 1
                    self.push(c, n)
            except (ClientError, OSError):
                self.cut += 1  # this push's answer never came
            finally:
                c.close()

    def push(self, c: TcpConnection, n: int) -> None:
        queue = f"deploy-{n % 4}"  # four queues: both shards
        reply = call(c, cmd="PUSH", queue=queue, data={"n": n}, durable=n % 3 == 0)
        if reply.get("ok"):
            with self.lock:
                self.acked.append(reply["id"])
        else:
            self.refused += 1  # e.g. while shutting down: not acknowledged, not expected
        time.sleep(0.002)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def _set_up_state(c: TcpConnection) -> dict[str, str]:
    done = call(c, cmd="PUSH", queue="st-done", data=1)["id"]
    pulled = call(c, cmd="PULL", queue="st-done", owner="w")
    assert call(c, cmd="ACK", id=done, token=pulled["token"], result={"r": 42})["ok"]
    assert call(c, cmd="PUSHB", queue="st-paused", jobs=[{"data": i} for i in range(3)])["ok"]
    assert call(c, cmd="Pause", queue="st-paused")["ok"]
    dead = call(c, cmd="PUSH", queue="st-dlq", data=2, maxAttempts=1)["id"]
    pulled = call(c, cmd="PULL", queue="st-dlq", owner="w")
    assert call(c, cmd="FAIL", id=dead, token=pulled["token"], error="boom")["ok"]
    return {"done": done, "dead": dead}


def _check_state(c: TcpConnection, ids: dict[str, str]) -> None:
    job = call(c, cmd="GetJob", id=ids["done"])["job"]
    assert job["state"] == "completed" and job["returnvalue"] == {"r": 42}
    assert call(c, cmd="IsPaused", queue="st-paused")["paused"] is True
    assert call(c, cmd="PULL", queue="st-paused", owner="w")["job"] is None  # still paused
    counts = call(c, cmd="GetJobCounts", queue="st-paused")["counts"]
    assert counts["waiting"] + counts["paused"] == 3
    entries = call(c, cmd="Dlq", queue="st-dlq")["jobs"]
    assert [e["id"] for e in entries] == [ids["dead"]]
    assert call(c, cmd="RetryDlq", queue="st-dlq")["count"] == 1
    assert call(c, cmd="GetJob", id=ids["dead"])["job"]["state"] == "waiting"


def test_rolling_sigterm_restarts_lose_nothing(tmp_path: Path) -> None:
    with ShardqServer(tmp_path / "data", shards=2).start() as server:
        with TcpConnection(*server.tcp_address) as c:
            state = _set_up_state(c)
        producer = Producer(server)
        producer.start()
        for _ in range(RESTARTS):
            before = producer.count()
            poll_until(lambda b=before: producer.count() >= b + MIN_PUSHES_BETWEEN,
                       TIMEOUT_S, "live pushes", detail=server.log_tail)  # fmt: skip
            assert server.stop() == 0
            server.start()
        poll_until(lambda: producer.count() >= before + MIN_PUSHES_BETWEEN, TIMEOUT_S, "pushes")
        producer.halt.set()
        producer.join(TIMEOUT_S)
        assert server.stop() == 0  # and one more, so the last pushes went through a stop too
        server.start()
        with TcpConnection(*server.tcp_address) as c:
            waiting = sum(
                call(c, cmd="GetJobCounts", queue=f"deploy-{q}")["counts"]["waiting"]
                for q in range(4)
            )
            states = {call(c, cmd="GetState", id=i).get("state") for i in producer.acked}
            _check_state(c, state)
        print(f"deploy: {RESTARTS + 1} restarts, {len(producer.acked)} pushes acknowledged, "
              f"{producer.refused} refused, {producer.cut} cut off, {waiting} stored")  # fmt: skip
        assert states == {"waiting"}  # every acknowledged push is there
        assert len(producer.acked) == len(set(producer.acked))
        # Only once: beyond the acknowledged pushes the queues hold at most the pushes whose
        # answer a closing connection cut off (applied, but the producer never heard "ok").
        assert len(producer.acked) <= waiting <= len(producer.acked) + producer.cut
