"""`skipIfNoWorker` on the real server (`shardq start --shards 2`): a schedule every second on a
queue nobody serves fires nothing; a registered worker makes it fire, and so does a pull
waiting on the queue; once the worker's connection closes it stops again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
WAIT_S = 20.0
QUEUE = "needs-worker"


def connect(server: ShardqServer) -> TcpConnection:
    return TcpConnection(*server.tcp_address, timeout=WAIT_S)


def fired(conn: TcpConnection) -> int:
    return len(conn.call({"cmd": "GetJobs", "queue": QUEUE, "limit": 100_000})["jobs"])


def cron_get(conn: TcpConnection) -> dict[str, Any]:
    cron: dict[str, Any] = conn.call({"cmd": "CronGet", "name": "needs-worker"})["cron"]
    return cron


def wait_for_slot(conn: TcpConnection, at: int) -> dict[str, Any]:
    """The schedule once its slot due at `at` (ms) or a later one was handled."""
    seen: list[dict[str, Any]] = []

    def handled() -> bool:
        seen.append(cron_get(conn))
        return (seen[-1]["lastRun"] or 0) >= at

    poll_until(
        handled, WAIT_S, f"the slot due at {at} to be handled", detail=lambda: str(seen[-1:])
    )
    return seen[-1]


def wait_for_skip(conn: TcpConnection) -> dict[str, Any]:
    """The schedule once a slot was handled with no fire: between two readings `lastRun`
    moved and `executions` did not."""
    seen = [cron_get(conn)]

    def skipped() -> bool:
        seen.append(cron_get(conn))
        before, now = seen[-2], seen[-1]
        return bool(
            now["lastRun"] != before["lastRun"] and now["executions"] == before["executions"]
        )

    poll_until(skipped, WAIT_S, "a slot skipped", detail=lambda: str(seen[-2:]))
    return seen[-1]


def test_a_schedule_skips_its_slots_while_no_worker_serves_its_queue(
    shardq_server: Factory,
) -> None:
    server = shardq_server(shards=2)
    with connect(server) as conn:
        schedule = {"cmd": "Cron", "name": "needs-worker", "queue": QUEUE, "data": {"k": 1}}
        made = conn.call(
            {**schedule, "repeatEvery": 1000, "skipIfNoWorker": True, "preventOverlap": False}
        )["cron"]
        assert made["skipIfNoWorker"] is True
        # Two slots come and go (each one's `lastRun`, set when it is handled, fired or not).
        handled = wait_for_slot(conn, made["nextRun"] + 1000)
        assert handled["lastRun"] is not None and handled["lastRun"] >= made["nextRun"]
        assert (fired(conn), handled["executions"]) == (0, 0)

        # A registered worker of the queue makes the next slots fire.
        with connect(server) as worker:
            reg = {"cmd": "RegisterWorker", "name": "w", "queues": [QUEUE], "workerId": "w-1"}
            assert worker.call(reg)["data"]["workerId"] == "w-1"
            poll_until(lambda: fired(conn) >= 2, WAIT_S, "2 jobs fired", detail=server.log_tail)
        # Its connection closed: the registration went with it, and so do the fires. A slot
        # already under way when the worker left may still fire: the first slot handled
        # without a fire shows the leaving taken in; then two more slots come and go.
        skipped = wait_for_skip(conn)
        stopped = fired(conn)
        after = wait_for_slot(conn, skipped["lastRun"] + 2000)
        assert fired(conn) == stopped
        assert after["executions"] == stopped

        # A worker that only pulls (no RegisterWorker) counts while its pull waits.
        got: list[dict[str, Any]] = []

        def pull() -> None:
            with connect(server) as puller:
                reply = puller.call({"cmd": "PULL", "queue": QUEUE, "timeout": 10_000})
                got.append(reply)

        for _ in range(stopped):  # drain the jobs already fired, so the pull waits
            assert conn.call({"cmd": "PULL", "queue": QUEUE})["job"] is not None
        puller = threading.Thread(target=pull, daemon=True)
        started = time.time() * 1000
        puller.start()
        puller.join(WAIT_S)
        assert not puller.is_alive()
        (reply,) = got
        assert reply["job"] is not None, "the waiting pull got no job from the schedule"
        assert reply["job"]["createdAt"] >= started - 1000  # a new slot's job, not an old one
        assert reply["job"]["data"] == {"k": 1}
    assert server.stop() == 0
