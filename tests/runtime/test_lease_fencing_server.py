"""Fenced leases through a real server, where the jobs of one pull share one lease record.

A worker pulls four jobs in one PULLB (one lease for all four) with a short lease, renews two
of them (a heartbeat and a lock extension, which give those two records of their own), and
lets the other two lapse. The lapsed two are delivered again to a second worker; the first
worker's ACKB and ACK with their old tokens are refused, exactly as a lapsed lease's are, and
change nothing; the second worker's tokens complete them. The renewed two stay with the first
worker, whose tokens still complete them, and nobody else could pull them meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
QUEUE = "fenced"
LOCK_MS = 1500  # long enough for the renewals to come first on a loaded machine
RENEWED_MS = 120_000
WAIT_S = 20.0
STALE = "Invalid or expired lock token"


def _call(conn: TcpConnection, **cmd: Any) -> dict[str, Any]:
    reply: dict[str, Any] = conn.call(cmd, check=False)
    return reply


def _state(conn: TcpConnection, job_id: str) -> str:
    reply = _call(conn, cmd="GetJob", id=job_id)
    assert reply["ok"], reply
    return str(reply["job"]["state"])


def test_stale_tokens_of_a_shared_lease_are_refused_after_redelivery(
    shardq_server: Factory,
) -> None:
    server = shardq_server()
    a = TcpConnection(*server.tcp_address, timeout=WAIT_S)
    b = TcpConnection(*server.tcp_address, timeout=WAIT_S)
    try:
        pushed = _call(a, cmd="PUSHB", queue=QUEUE, jobs=[{"data": {"i": i}} for i in range(4)])
        ids = list(pushed["ids"])
        pulled = _call(a, cmd="PULLB", queue=QUEUE, count=4, owner="a", lockTtl=LOCK_MS)
        assert [job["id"] for job in pulled["jobs"]] == ids
        tokens = list(pulled["tokens"])
        renew = {"id": ids[0], "token": tokens[0], "duration": RENEWED_MS}
        assert _call(a, cmd="JobHeartbeat", **renew)["ok"]
        assert _call(a, cmd="ExtendLock", id=ids[1], token=tokens[1], duration=RENEWED_MS)["ok"]

        # The other two lapse; the renewed two must not lapse with them.
        def lapsed() -> bool:
            return all(_state(b, job_id) != "active" for job_id in ids[2:])

        poll_until(lapsed, WAIT_S, "the two unrenewed leases to lapse")
        assert [_state(b, job_id) for job_id in ids[:2]] == ["active", "active"]
        again = _call(b, cmd="PULLB", queue=QUEUE, count=4, owner="b", lockTtl=RENEWED_MS)
        assert sorted(job["id"] for job in again["jobs"]) == sorted(ids[2:])
        new_tokens = dict(zip([job["id"] for job in again["jobs"]], again["tokens"], strict=True))

        # The first worker's old tokens: refused, whole batch and one by one, and no effect.
        stale = _call(a, cmd="ACKB", ids=ids[2:], tokens=tokens[2:])
        assert not stale["ok"] and stale["error"].startswith(STALE), stale
        for job_id, token in zip(ids[2:], tokens[2:], strict=True):
            one = _call(a, cmd="ACK", id=job_id, token=token)
            assert not one["ok"] and one["error"].startswith(STALE), one
            failed = _call(a, cmd="FAIL", id=job_id, token=token, error="late")
            assert not failed["ok"] and failed["error"].startswith(STALE), failed
        assert [_state(b, job_id) for job_id in ids] == ["active"] * 4

        # A token of one job does not complete another, old or new.
        crossed = _call(a, cmd="ACKB", ids=[ids[0]], tokens=[tokens[1]])
        assert not crossed["ok"] and crossed["error"].startswith(STALE), crossed
        crossed = _call(b, cmd="ACK", id=ids[1], token=new_tokens[ids[2]])
        assert not crossed["ok"] and crossed["error"].startswith(STALE), crossed

        # The holders' own tokens complete every job, each once.
        fresh = [new_tokens[job_id] for job_id in ids[2:]]
        for conn, done, held in ((b, ids[2:], fresh), (a, ids[:2], tokens[:2])):
            acked = _call(conn, cmd="ACKB", ids=done, tokens=held)
            assert acked["ok"] and "data" not in acked, acked  # none ignored
        assert [_state(b, job_id) for job_id in ids] == ["completed"] * 4
        counts = _call(b, cmd="GetJobCounts", queue=QUEUE)["counts"]
        assert counts["completed"] == 4 and counts["active"] == 0
    finally:
        a.close()
        b.close()
