"""A lone durable push is committed by the writer with its one statement and no transaction
around it (`Store._apply_lone_put`): its `ok` must still mean the job is in the file, so a
kill -9 of every process right after the last `ok` keeps every job answered."""

from __future__ import annotations

from collections.abc import Callable

from shardq_harness import ShardqServer

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
PUSHES = 40


def test_lone_durable_pushes_survive_kill9_of_the_whole_tree(shardq_server: Factory) -> None:
    server = shardq_server(shards=1)
    ids: list[str] = []
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        for i in range(PUSHES):  # one at a time: each is a batch of one put, one commit
            command = {"cmd": "PUSH", "queue": "lone", "data": {"i": i}, "durable": True}
            ids.append(conn.call(command)["id"])
        server.kill9_tree()  # the shard cannot resend anything: only the file holds them
    again = shardq_server(shards=1)  # the same data directory
    with TcpConnection(*again.tcp_address, timeout=30) as conn:
        replies = conn.call_many([{"cmd": "GetJob", "id": i} for i in ids], check=False)
        counts = conn.call({"cmd": "GetJobCounts", "queue": "lone"})["counts"]
    lost = [i for i, r in zip(ids, replies, strict=True) if not r.get("ok")]
    assert lost == [], f"{len(lost)} of {PUSHES} acknowledged lone durable pushes lost"
    assert [r["job"]["data"]["i"] for r in replies] == list(range(PUSHES))
    assert counts["waiting"] == PUSHES, counts
    assert again.stop() == 0, again.log_tail()
