"""A shard that dies with requests in flight: its clients get "Shard unavailable" at once, not
silence, and the restarted shard serves again (STYLE.md: every pending request gets an answer)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of

Factory = Callable[..., ShardqServer]
WAIT_S = 15.0


def _queue_on(shard: int) -> str:
    return next(q for q in (f"su-{i}" for i in range(100)) if shard_of(q, 2) == shard)


def test_requests_to_a_dying_shard_are_answered_unavailable(shardq_server: Factory) -> None:
    server = shardq_server(shards=2)
    on0, on1 = _queue_on(0), _queue_on(1)
    pid = server.child_pids()["shard-0"]
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        conn.call({"cmd": "PUSH", "queue": on0, "data": 1})
        os.kill(pid, signal.SIGSTOP)  # requests now wait inside the shard's mailbox
        # The kill comes from a timer while this thread waits for the replies.
        threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
        started = time.monotonic()
        held = conn.call_many(
            [
                {"cmd": "PUSH", "queue": on0, "data": 2, "durable": True},
                {"cmd": "PUSH", "queue": on0, "data": 3},
                {"cmd": "PUSH", "queue": on1, "data": 4},
            ],
            window=3,
            check=False,
        )
        elapsed = time.monotonic() - started
        assert [r["ok"] for r in held] == [False, False, True]
        assert all(r["error"] == "Shard unavailable: shard 0 is restarting" for r in held[:2])
        # Answered at once, not by a timeout: the only one in reach is this client's own
        # (`WAIT_S`; the front end's hold for a recycled shard, 30 s, is longer), which a stall
        # of the server or of this test does not bring nearer.
        assert elapsed < WAIT_S, "the dead shard's requests waited for a timeout"
        new = server.wait_child_replaced("shard-0", pid, WAIT_S)
        assert new != pid

        def served() -> bool:
            reply = conn.call({"cmd": "PUSH", "queue": on0, "data": 5}, check=False)
            return bool(reply.get("ok"))

        poll_until(served, WAIT_S, "shard 0 to serve again after its restart")
        # GetJob of an unknown id while every shard is up is a plain "not found".
        missing = conn.call({"cmd": "GetJob", "id": "nope"}, check=False)
        assert missing == {"ok": False, "error": "Job not found", "reqId": missing["reqId"]}
    assert server.stop() == 0
