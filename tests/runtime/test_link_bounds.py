"""Large replies on the front end <-> shard link: split across bounded frames, never a lost link.

Issue 10's probe: one 9.5 MB job and 30 `GetJob` for it in one write made the shard answer
all 30 in one 285 MB link frame, over the link's limit; the front end dropped the link and the
live shard answered "Shard unavailable" for good. Replies now go out in frames of at most
`link_max_frame_bytes`, and one reply larger than that alone becomes an error for its request.
"""

from __future__ import annotations

from collections.abc import Callable

from shardq_harness import ShardqServer
from wire_clients import Tcp

Factory = Callable[..., ShardqServer]
WAIT_S = 60.0
BIG = 9_500_000


def _push(tcp: Tcp, data: object) -> str:
    reply = tcp.call({"cmd": "PUSH", "queue": "big", "data": data, "durable": True}, WAIT_S)
    assert reply["ok"], reply
    return str(reply["id"])


def test_thirty_reads_of_a_large_job_keep_the_shard_up(shardq_server: Factory) -> None:
    # No write backlog bound here: 285 MB of replies asked for at once is past the default
    # 64 MiB, which would cut this client (as bunqueue would) before it had read them all.
    server = shardq_server(shards=1, env={"SHARDQ_TCP_MAX_WRITE_BACKLOG_BYTES": "0"})
    shard_pid = server.child_pids()["shard-0"]
    probe = Tcp(server.tcp_address, timeout=WAIT_S)
    job_id = _push(probe, "x" * BIG)
    reqs = probe.send(*({"cmd": "GetJob", "id": job_id} for _ in range(30)))
    replies = [probe.wait(req) for req in reqs]
    # Every read is answered with the whole job: the 285 MB of replies crossed the link in
    # several frames under the 64 MiB default.
    assert all(r["ok"] and len(r["job"]["data"]) == BIG for r in replies)
    probe.close()
    healthy = Tcp(server.tcp_address, timeout=WAIT_S)
    assert _push(healthy, "small")
    assert healthy.call({"cmd": "GetJob", "id": job_id})["ok"]
    healthy.close()
    assert server.find_log("shard link lost; reconnecting") is None
    assert server.child_pids()["shard-0"] == shard_pid
    assert server.stop() == 0


def test_a_reply_over_the_link_limit_fails_alone(shardq_server: Factory) -> None:
    limit = 1024 * 1024
    server = shardq_server(shards=1, env={"SHARDQ_LINK_MAX_FRAME_BYTES": str(limit)})
    tcp = Tcp(server.tcp_address, timeout=WAIT_S)
    big_id = _push(tcp, "y" * (2 * limit))
    small_id = _push(tcp, "small")
    # Three reads in one write, so their replies share one batch in the shard: only the one
    # too large to cross the link is refused.
    first, big, last = tcp.send(
        {"cmd": "GetJob", "id": small_id},
        {"cmd": "GetJob", "id": big_id},
        {"cmd": "GetJob", "id": small_id},
    )
    assert tcp.wait(first)["job"]["data"] == "small"
    refused = tcp.wait(big)
    assert refused["ok"] is False
    assert refused["error"].startswith("Reply too large: ")
    assert tcp.wait(last)["job"]["data"] == "small"
    # Replies that fit, several per batch, still cross: a batch of them over the limit (ten
    # 300 KB replies in one turn) goes out in several frames.
    mid_id = _push(tcp, "m" * 300_000)
    reqs = tcp.send(*({"cmd": "GetJob", "id": mid_id} for _ in range(10)))
    assert all(len(tcp.wait(req)["job"]["data"]) == 300_000 for req in reqs)
    assert server.wait_for_log("reply too large for the front-end link")["size"] > limit
    assert server.find_log("shard link lost; reconnecting") is None
    tcp.close()
    assert server.stop() == 0
