"""A Worker's one-by-one ACKs, pipelined through a real server, where the shard takes the run of
them in one pass (`Consumer.ack_run`) and checks the common one, an active job's own lease
token, inline (`Consumer._leased`). Every other ACK still gets what `fence` answers: a token of
another job, no token, a second ACK of a completed job, an unknown id; and jobs with options
(removeOnComplete, attempts) complete as the bare ones do, each ACK answered in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
QUEUE = "acked"
WAIT_S = 20.0
STALE = "Invalid or expired lock token for job "
NEEDED = "Lock token required for job "
NOT_PROCESSING = "Job not found or not in processing state: "


def _state(conn: TcpConnection, job_id: str) -> str | None:
    """The job's state; None once it is removed."""
    reply = conn.call({"cmd": "GetJob", "id": job_id}, check=False)
    if reply == {"ok": False, "error": "Job not found", "reqId": reply.get("reqId")}:
        return None
    assert reply["ok"], reply
    return str(reply["job"]["state"])


def _bare(replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The replies without their request ids."""
    return [{k: v for k, v in reply.items() if k != "reqId"} for reply in replies]


def test_pipelined_acks_each_get_what_fencing_answers(shardq_server: Factory) -> None:
    server = shardq_server()
    conn = TcpConnection(*server.tcp_address, timeout=WAIT_S)
    try:
        jobs: list[dict[str, Any]] = [{"data": {"i": i}} for i in range(6)]
        jobs += [{"data": {"i": 6}, "removeOnComplete": True}, {"data": 7, "attempts": 3}]
        ids = list(conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})["ids"])
        pull = {"cmd": "PULLB", "queue": QUEUE, "count": 8, "owner": "w", "lockTtl": 60_000}
        pulled = conn.call(pull)
        assert [job["id"] for job in pulled["jobs"]] == ids
        tokens = list(pulled["tokens"])

        def ack(n: int, token: object) -> dict[str, Any]:
            return {"cmd": "ACK", "id": ids[n], "token": token}

        acks = [
            ack(0, tokens[0]),
            ack(1, tokens[1]),
            ack(2, tokens[3]),  # another job's token
            {"cmd": "ACK", "id": ids[3]},  # no token for a leased job
            ack(0, tokens[0]),  # again: completed by this very delivery
            ack(4, tokens[4]),
            {"cmd": "ACK", "id": "no-such-job", "token": tokens[5]},
            ack(5, tokens[5]),
            ack(6, tokens[6]),  # removeOnComplete
            ack(7, tokens[7]),  # an option of its own
        ]
        replies = _bare(conn.call_many(acks, check=False))
        assert replies == [
            {"ok": True},
            {"ok": True},
            {"ok": False, "error": STALE + ids[2]},
            {"ok": False, "error": NEEDED + ids[3]},
            {"ok": True},
            {"ok": True},
            {"ok": False, "error": NOT_PROCESSING + "no-such-job"},
            {"ok": True},
            {"ok": True},
            {"ok": True},
        ], replies
        states = [_state(conn, job_id) for job_id in ids]
        done = "completed"
        assert states == [done, done, "active", "active", done, done, None, done], states

        # The two refused ones are still this worker's, and its own tokens complete them.
        replies = _bare(conn.call_many([ack(2, tokens[2]), ack(3, tokens[3])], check=False))
        assert replies == [{"ok": True}, {"ok": True}], replies
        counts = conn.call({"cmd": "GetJobCounts", "queue": QUEUE})["counts"]
        assert counts["completed"] == 7 and counts["active"] == 0, counts
    finally:
        conn.close()
