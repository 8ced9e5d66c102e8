"""An idle shard wakes for each deadline it keeps, on a real server (docs/runtime.md, "A shard's
turn"): its loop asks a source for its next deadline only when the source's own table holds
something, so each source is checked here with nothing else to wake the shard. The front end
serves the connection (no handoff: a direct connection's idle sweep would wake the shard every
second), the idle give-back and recycle checks are off and there is no HTTP process, so a
deadline the loop failed to ask for leaves the shard asleep and the call times out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
QUIET = {
    "SHARDQ_TCP_HANDOFF": "false",
    "SHARDQ_MEMORY_RELEASE_IDLE_MS": "0",
    "SHARDQ_SHARD_RECYCLE_IDLE_MS": "0",
}
DUE_MS = 400
# Far above a timely wake even on a loaded machine, far below the hour an idle shard sleeps.
LATE_S = 4.0
CALL_TIMEOUT_S = 10.0


def _timed(conn: TcpConnection, cmd: dict[str, Any]) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    reply: dict[str, Any] = conn.call(cmd)
    return reply, time.monotonic() - started


def test_an_idle_shard_wakes_for_each_kind_of_deadline(shardq_server: Factory) -> None:
    server = shardq_server(shards=1, env=QUIET)
    with TcpConnection(*server.tcp_address, timeout=CALL_TIMEOUT_S) as conn:
        # A long-poll's own timeout (the parked pulls' deadlines).
        reply, took = _timed(conn, {"cmd": "PULL", "queue": "empty", "timeout": DUE_MS})
        assert reply["ok"] and reply.get("job") is None
        assert DUE_MS / 1000 * 0.9 <= took < LATE_S

        # A WaitJob's timeout (the parked waits' deadlines), on a job nobody takes.
        pushed = conn.call({"cmd": "PUSH", "queue": "idle", "data": {}})
        reply, took = _timed(conn, {"cmd": "WaitJob", "id": pushed["id"], "timeout": DUE_MS})
        assert reply["ok"] and reply["completed"] is False
        assert DUE_MS / 1000 * 0.9 <= took < LATE_S

        # A delayed job's promotion (the engine's timers), to a pull parked meanwhile.
        delayed = conn.call({"cmd": "PUSH", "queue": "later", "data": {}, "delay": DUE_MS})
        reply, took = _timed(conn, {"cmd": "PULL", "queue": "later", "timeout": 8_000})
        assert reply["job"]["id"] == delayed["id"]
        assert took < LATE_S

        # A rate limit's window (the limiter's deadline): the second job waits for it.
        assert conn.call({"cmd": "RateLimit", "queue": "rated", "limit": 1, "duration": DUE_MS})
        jobs = [{"data": {"i": i}} for i in range(2)]
        assert conn.call({"cmd": "PUSHB", "queue": "rated", "jobs": jobs})["ok"]
        first = conn.call({"cmd": "PULL", "queue": "rated", "timeout": 8_000})
        assert first["job"] is not None
        reply, took = _timed(conn, {"cmd": "PULL", "queue": "rated", "timeout": 8_000})
        assert reply["job"] is not None and reply["job"]["id"] != first["job"]["id"]
        assert took < LATE_S
    assert server.stop() == 0, server.log_tail()
