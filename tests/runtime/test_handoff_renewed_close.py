"""A handed-off worker that closes with a renewed lease (docs/protocol.md §2.6, bunqueue's
rule): its jobs never renewed go back to waiting at the close, uncharged, wherever the
connection was served then (on its shard, or back on the front end); the one whose lease was
renewed, from this connection or another, stays active, renewable and ACK-able by the
worker, until its lease runs out, and is then reclaimed like any lapsed lease (an attempt
charged). A heartbeat from another connection does not move a lease to that connection: its
close releases nothing.

Raw sockets against a real server with 2 shards, as `test_handoff_registry.py`.
"""

from __future__ import annotations

from typing import Any

import pytest
from shardq_harness import ShardqServer, poll_until
from test_handoff_frames import AFTER, WAIT_S, Factory, _queue_on, _started, _stats
from test_handoff_workers import _call, _fill, _handed_worker

LONG_BACKOFF = {"SHARDQ_TCP_HANDOFF_BACKOFF_MS": "600000"}
TTL_MS = 10_000  # long enough to see the lease outlive the close, short enough to see it lapse


def _job(server: ShardqServer, job_id: str) -> dict[str, Any]:
    job: dict[str, Any] = _call(server, {"cmd": "GetJob", "id": job_id})["job"]
    return job


def _released(server: ShardqServer, ids: list[str]) -> bool:
    return all(_job(server, i)["state"] == "waiting" for i in ids)


@pytest.mark.parametrize("where", ["on-shard", "handed-back"])
def test_a_renewed_lease_outlives_the_close_and_the_others_come_back(
    shardq_server: Factory, where: str
) -> None:
    server = _started(shardq_server, LONG_BACKOFF)
    queue = _queue_on(1, "renewed")
    _fill(server, queue, AFTER + 3)
    raw = _handed_worker(server, queue)
    try:
        (got,) = raw.call([{"cmd": "PULLB", "queue": queue, "count": 3, "owner": "w",
                            "lockTtl": TTL_MS}])  # fmt: skip
        ids, tokens = [j["id"] for j in got["jobs"]], got["tokens"]
        # The first job's token, none for the others: a renewal of the first, only a sign of
        # life for the others (not a renewal).
        short = {"cmd": "JobHeartbeatB", "ids": ids, "tokens": tokens[:1]}
        if where == "handed-back":
            (reply,) = raw.call([short])  # tokens and ids do not line up: the front end's
            poll_until(lambda: _stats(server)["handedBack"] == 1, WAIT_S, "the hand-back")
        else:
            reply = _call(server, short)  # from another connection, which then closes
            assert _stats(server)["handedBack"] == 0
        assert reply["data"] == {"ok": True, "count": 3}, reply
        # Whatever connection heartbeated them, the jobs are still the puller's.
        assert _call(server, {"cmd": "JobHeartbeatB", "ids": ids})["data"]["count"] == 3
        assert [_job(server, i)["state"] for i in ids] == ["active"] * 3
    finally:
        raw.sock.close()
    poll_until(lambda: _released(server, ids[1:]), WAIT_S, "the unrenewed leases released")
    assert [_job(server, i)["attempts"] for i in ids[1:]] == [0, 0]  # released, not lapsed
    # The renewed one is still leased to its worker: renewable (a live lease only) by token.
    renew = {"cmd": "JobHeartbeat", "id": ids[0], "token": tokens[0]}
    assert _call(server, renew)["data"] == {"ok": True}
    assert _job(server, ids[0])["attempts"] == 0
    # Unrenewed, its lease runs out: reclaimed like any lapsed lease, one attempt charged.
    poll_until(lambda: _released(server, ids[:1]), WAIT_S, "the renewed lease lapsed")
    assert _job(server, ids[0])["attempts"] == 1
