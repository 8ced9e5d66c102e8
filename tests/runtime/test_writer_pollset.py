"""The writer keeps its poll set from turn to turn (`writer/_pollset.py`) and changes it only
when the descriptors it wants change. A link added or removed must still be heard: with real
sockets, and on a real server whose shard is killed and comes back on new links."""

from __future__ import annotations

import os
import select
import signal
import socket
from collections.abc import Callable

from shardq_harness import ShardqServer

from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of
from shardq.runtime.writer._pollset import PollSet

WAIT_MS = 2_000
RECOVER_S = 60.0


def ready(poll_set: PollSet, wanted: dict[int, int]) -> dict[int, int]:
    return dict(poll_set.watch(wanted).poll(WAIT_MS))


def test_every_wanted_descriptor_wakes_the_poll_after_changes() -> None:
    poll_set = PollSet()
    a, a_peer = socket.socketpair()
    b, b_peer = socket.socketpair()
    try:
        both = {a.fileno(): select.POLLIN, b.fileno(): select.POLLIN}
        a_peer.send(b"x")
        b_peer.send(b"y")
        assert ready(poll_set, both) == both
        assert poll_set.registered() == both
        a.recv(1)
        b.recv(1)
        # `b` goes away: its descriptor is not wanted any more, and is not polled.
        b_fd = b.fileno()
        b.close()
        b_peer.close()
        only_a = {a.fileno(): select.POLLIN}
        a_peer.send(b"x")
        assert ready(poll_set, only_a) == only_a  # no POLLNVAL for the closed descriptor
        assert poll_set.registered() == only_a
        a.recv(1)
        # A new link, likely on the descriptor number `b` had: it wakes the poll too.
        c, c_peer = socket.socketpair()
        with c, c_peer:
            with_c = {a.fileno(): select.POLLIN, c.fileno(): select.POLLIN}
            c_peer.send(b"z")
            assert ready(poll_set, with_c) == {c.fileno(): select.POLLIN}
            assert c.fileno() == b_fd or b_fd not in poll_set.registered()
            # A mask changed in place: the same descriptor now watched for writing too.
            writing = {a.fileno(): select.POLLIN, c.fileno(): select.POLLIN | select.POLLOUT}
            assert ready(poll_set, writing)[c.fileno()] & select.POLLOUT
            assert poll_set.registered() == writing
    finally:
        for sock in (a, a_peer):
            sock.close()


def durable_push(conn: TcpConnection, queue: str, n: int) -> None:
    reply = conn.call({"cmd": "PUSH", "queue": queue, "data": {"n": n}, "durable": True})
    assert reply["ok"] and reply["id"], reply


def test_a_shard_back_on_new_links_is_still_heard(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=2, env={"SHARDQ_SPIN_US": "0"})
    queues = [next(f"q{s}-{i}" for i in range(1000) if shard_of(f"q{s}-{i}", 2) == s)
              for s in (0, 1)]  # fmt: skip
    with TcpConnection(*server.tcp_address) as conn:
        for n, queue in enumerate(queues):
            durable_push(conn, queue, n)
    old = server.child_pids()["shard-1"]
    os.kill(old, signal.SIGKILL)  # its links (data and bell) close; new ones come
    server.wait_child_replaced("shard-1", old, RECOVER_S)
    with TcpConnection(*server.tcp_address) as conn:
        for n in range(3):
            for queue in queues:
                # A buffered push leaves the link unread until the commit; the durable one
                # behind it is answered only if the writer hears the new link and bell.
                conn.call({"cmd": "PUSH", "queue": queue, "data": {"buffered": n}})
                durable_push(conn, queue, n)
        counts = [conn.call({"cmd": "Count", "queue": q})["count"] for q in queues]
    assert counts == [7, 7], counts
    assert server.stop() == 0, server.log_tail()
