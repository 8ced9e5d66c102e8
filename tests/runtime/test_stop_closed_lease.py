"""A graceful stop does not wait for a renewed lease whose connection closed (docs/runtime.md,
"Graceful shutdown").

Such a job stays active after the close (docs/protocol.md §2.6: a pooled client may renew or
ACK it over another connection). During the stop's drain no new TCP connection is taken, so
only a client still connected can finish it. The drain therefore waits for the jobs an open
connection holds, and for a kept job renewed again after its close (its worker showed it is
alive elsewhere), but not for one left as it was at the close: that one stays active in
storage and the next start recovers it (one attempt charged, docs/protocol.md §4.12), so it
is delivered again and nothing is lost. Before, such a job held the stop until its lease ran
out or `shutdown_timeout_ms` (30 s) passed.

Real server, real client (`TcpConnection`), one shard.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
QUEUE = "closed-lease"
LOCK_MS = 120_000  # far past the drain timeout: the lease never lapses during the test
WAIT_S = 20.0  # under the 30 s drain timeout: a stop that waits it out fails here


def _call(conn: TcpConnection, **cmd: Any) -> dict[str, Any]:
    reply: dict[str, Any] = conn.call(cmd, check=False)
    assert reply["ok"], reply
    return reply


def _pull(conn: TcpConnection, owner: str, count: int = 1, wait_ms: int = 0) -> list[Any]:
    """Jobs pulled with a lease (waiting up to `wait_ms` for one): (id, token) pairs."""
    got = _call(conn, cmd="PULLB", queue=QUEUE, count=count, owner=owner, lockTtl=LOCK_MS,
                timeout=wait_ms)  # fmt: skip
    pairs = zip(got["jobs"], got["tokens"], strict=True)
    return [(str(job["id"]), str(token)) for job, token in pairs]


def _pull_renewed(server: ShardqServer, watch: TcpConnection, owner: str) -> tuple[str, str]:
    """Two jobs pulled, the first renewed, by a worker whose connection then closes; returns
    once the server has handled the close (the unrenewed second job is waiting again)."""
    conn = TcpConnection(*server.tcp_address, timeout=WAIT_S)
    try:
        (job_id, token), (other_id, _) = _pull(conn, owner, count=2)
        _call(conn, cmd="JobHeartbeat", id=job_id, token=token)
    finally:
        conn.close()
    poll_until(lambda: _state(watch, other_id)["state"] == "waiting", WAIT_S, "the close")
    return job_id, token


def _state(conn: TcpConnection, job_id: str) -> dict[str, Any]:
    job: dict[str, Any] = _call(conn, cmd="GetJob", id=job_id)["job"]
    return job


def test_the_drain_waits_for_connected_workers_only(shardq_server: Factory) -> None:
    server = shardq_server()
    held = TcpConnection(*server.tcp_address, timeout=WAIT_S)  # a worker that stays connected
    other = TcpConnection(*server.tcp_address, timeout=WAIT_S)  # a pooled client's other one
    try:
        ids = _call(held, cmd="PUSHB", queue=QUEUE, jobs=[{"data": {"i": i}} for i in range(3)])
        gone, _ = _pull_renewed(server, held, "gone")  # its worker is gone with its connection
        alive, alive_token = _pull_renewed(server, held, "pooled")
        _call(other, cmd="JobHeartbeat", id=alive, token=alive_token)  # renewed after the close
        ((open_job, open_token),) = _pull(held, "held")
        assert [gone, alive, open_job] == ids["ids"]
        assert [_state(other, i)["state"] for i in ids["ids"]] == ["active"] * 3

        server.signal(signal.SIGTERM)
        poll_until(lambda: server.find_log("front end draining"), WAIT_S, "the drain")
        # The drain waits for what connected workers hold: their ACKs are still answered.
        _call(held, cmd="ACK", id=open_job, token=open_token)
        _call(other, cmd="ACK", id=alive, token=alive_token)
        # Not for the job whose worker is gone: the stop ends without the drain timeout.
        assert server.wait_exit(WAIT_S) == 0, server.log_tail()
    finally:
        held.close()
        other.close()
    assert server.find_log("drain timeout; closing with jobs active") is None
    left = server.find_log("drained; leases of closed connections left to the next start")
    assert left is not None and left["jobs"] == 1, server.log_tail()

    # At-least-once: the next start recovers the job left active, and delivers it again.
    server.start()
    conn = TcpConnection(*server.tcp_address, timeout=WAIT_S)
    try:
        assert [_state(conn, i)["state"] for i in (alive, open_job)] == ["completed"] * 2
        again = _state(conn, gone)
        # Charged as a stall: a retry after its backoff (1 s by default).
        assert (again["state"], again["attempts"]) == ("delayed", 1), again
        ((job_id, token),) = _pull(conn, "new", wait_ms=int(WAIT_S * 1000))
        assert job_id == gone
        _call(conn, cmd="ACK", id=gone, token=token)
        counts = _call(conn, cmd="GetJobCounts", queue=QUEUE)["counts"]
        assert (counts["completed"], counts["active"], counts["waiting"]) == (3, 0, 0), counts
    finally:
        conn.close()
