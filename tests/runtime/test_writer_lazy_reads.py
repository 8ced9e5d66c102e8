"""The writer reads buffered batches once per group commit, not once per push, and a durable
push behind them still rings it (docs/runtime.md, "Lazy reads"). On a real server: its stop
line counts the writer's reads of the shard links and the bells it heard; a kill -9 of the
whole tree right after durable replies loses none of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer

from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of

PUSHES = 300
PAIRS = 40
# Reads of the shard link per buffered push, one at a time: reading each as it came, the
# writer read 298 of 300; once per window, a few in a hundred at 10 ms. The window is 100 ms
# here so that the bound holds on a machine slow enough to take 25 ms per push.
MAX_READS_PER_PUSH = 0.25
# Wake-ups, not spins: the count is the writer's reads.
QUIET = {"SHARDQ_SPIN_US": "0", "SHARDQ_FLUSH_INTERVAL_MS": "100"}
ANSWER_S = 20.0  # a durable reply's limit: a third of a window that never ends here


def writer_stopping(server: ShardqServer) -> dict[str, Any]:
    [line] = [line for line in server.logs() if line.get("event") == "writer stopping"]
    return line


def test_buffered_pushes_are_read_once_per_commit(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=1, env=QUIET)
    with TcpConnection(*server.tcp_address) as conn:
        for n in range(PUSHES):  # one in flight at a time: the web request's push
            reply = conn.call({"cmd": "PUSH", "queue": "lazy", "data": {"n": n}})
            assert reply["ok"] and reply["id"], reply
        count = conn.call({"cmd": "Count", "queue": "lazy"})
        assert count["ok"] and count["count"] == PUSHES, count
    assert server.stop() == 0, server.log_tail()
    stopping = writer_stopping(server)
    # The writer is told of the jobs by reading its link: at least once, and once per
    # window, not once per push.
    assert 1 <= stopping["link_reads"] <= PUSHES * MAX_READS_PER_PUSH, stopping
    restarted = shardq_server(shards=1, env=QUIET)
    with TcpConnection(*restarted.tcp_address) as conn:
        count = conn.call({"cmd": "Count", "queue": "lazy"})
        assert count["ok"] and count["count"] == PUSHES, count  # all were committed


def push_pairs(server: ShardqServer) -> list[str]:
    """A buffered push then a durable one, `PAIRS` times; the durable pushes' ids."""
    durable: list[str] = []
    with TcpConnection(*server.tcp_address) as conn:
        for n in range(PAIRS):
            # A buffered push leaves the link unread until its commit; the durable one
            # behind it is answered only once committed, which the bell asks for at once.
            buffered = conn.call({"cmd": "PUSH", "queue": "mixed", "data": {"n": n}})
            assert buffered["ok"], buffered
            reply = conn.call(
                {"cmd": "PUSH", "queue": "mixed", "data": {"d": n}, "durable": True}
            )
            assert reply["ok"] and reply["id"], reply
            durable.append(reply["id"])
    return durable


def test_durable_push_behind_buffered_ones_rings_and_survives_kill9(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=1, env=QUIET)
    durable = push_pairs(server)
    assert server.stop() == 0, server.log_tail()
    # Each durable push came right behind a buffered batch not yet confirmed: its shard rang.
    assert writer_stopping(server)["rings"] >= 1, writer_stopping(server)
    server = shardq_server(shards=1, env=QUIET)
    durable += push_pairs(server)
    server.kill9_tree()  # nobody flushes anything now
    restarted = shardq_server(shards=1, env=QUIET)
    with TcpConnection(*restarted.tcp_address) as conn:
        replies = conn.call_many(({"cmd": "GetJob", "id": i} for i in durable), check=False)
        lost = [i for i, got in zip(durable, replies, strict=True) if not got.get("ok")]
        assert not lost, f"{len(lost)} durable pushes lost: {lost[:3]}"
        count = conn.call({"cmd": "Count", "queue": "mixed"})
        assert count["ok"] and count["count"] >= 3 * PAIRS, count  # a buffered one may be lost
    assert restarted.stop() == 0, restarted.log_tail()


def test_durable_pushes_are_answered_while_a_window_of_a_minute_is_pending(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    """Only the bell or a link left in the writer's poll can get a durable push committed
    before the window ends; either left unread would wait the whole minute."""
    env = {"SHARDQ_SPIN_US": "0", "SHARDQ_FLUSH_INTERVAL_MS": "60000"}
    server = shardq_server(shards=2, env=env)
    first = next(f"a{i}" for i in range(1000) if shard_of(f"a{i}", 2) == 0)
    other = next(f"b{i}" for i in range(1000) if shard_of(f"b{i}", 2) == 1)
    with TcpConnection(*server.tcp_address, timeout=ANSWER_S) as conn:
        for n in range(3):
            # After a buffered batch the first shard's link is left unread: a durable push on
            # the other shard is read as it comes (its shard has nothing unconfirmed and does
            # not ring), and one on the first shard rings.
            for queue in (other, first):
                buffered = conn.call({"cmd": "PUSH", "queue": first, "data": {"n": n}})
                assert buffered["ok"], buffered
                push = {"cmd": "PUSH", "queue": queue, "data": {"n": n}, "durable": True}
                reply = conn.call(push)
                assert reply["ok"] and reply["id"], reply
    assert server.stop() == 0, server.log_tail()
    assert writer_stopping(server)["rings"] >= 1, writer_stopping(server)
