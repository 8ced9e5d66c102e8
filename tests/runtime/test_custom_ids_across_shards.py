"""A custom id reused on queues of two shards makes two jobs, and both survive a restart.

Their rows used to collide in the one SQLite file (a custom id becomes the job id), so after
a restart one of the two acknowledged durable jobs was gone.
"""

from __future__ import annotations

from collections.abc import Callable

from shardq_harness import ShardqServer

from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of

Factory = Callable[..., ShardqServer]


def _queue_on(shard: int) -> str:
    return next(q for q in (f"ci-{i}" for i in range(100)) if shard_of(q, 2) == shard)


def test_one_custom_id_on_two_shards_keeps_both_jobs_across_a_restart(
    shardq_server: Factory,
) -> None:
    on0, on1 = _queue_on(0), _queue_on(1)
    server = shardq_server(shards=2)
    with TcpConnection(*server.tcp_address) as conn:
        for queue, data in ((on0, "zero"), (on1, "one")):
            reply = conn.call({"cmd": "PUSH", "queue": queue, "jobId": "order-1", "data": data,
                               "durable": True})  # fmt: skip
            assert reply["id"] == "order-1"
    assert server.stop() == 0

    again = shardq_server(shards=2)
    with TcpConnection(*again.tcp_address) as conn:
        for queue, data in ((on0, "zero"), (on1, "one")):
            counts = conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"]
            assert counts["waiting"] == 1, (queue, counts)
            pulled = conn.call({"cmd": "PULL", "queue": queue, "owner": "w"})
            assert pulled["job"]["id"] == "order-1" and pulled["job"]["data"] == data
            conn.call({"cmd": "ACK", "id": "order-1", "token": pulled["token"]})
    assert again.stop() == 0
