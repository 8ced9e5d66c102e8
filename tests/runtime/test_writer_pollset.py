"""The writer keeps its poll set from turn to turn (`writer/_pollset.py`) and changes it only
when the descriptors it wants change, and works them out only when the links' `generation`
moves (`Writer._poll`). A link added or removed must still be heard: with real
sockets, and on a real server whose shard is killed and comes back on new links."""

from __future__ import annotations

import os
import select
import signal
import socket
from collections.abc import Callable
from pathlib import Path

from shardq_harness import ShardqServer
from test_writer_lone_batch import _accepted

from shardq.client import TcpConnection
from shardq.protocol import FRAME_HEADER, frame
from shardq.runtime._routing import shard_of
from shardq.runtime.links._writer import ShardConnections
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


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return sock


def test_the_links_generation_moves_with_every_descriptor_to_poll(tmp_path: Path) -> None:
    """The writer rebuilds its poll set only when `generation` moves (`Writer._poll`): it
    must move when a link comes or goes and when a link's unsent output appears or is all
    sent (watched for writing), and stay put while a frame is read or sent whole."""
    links = ShardConnections(str(tmp_path / "w.sock"))
    peer = _connect(str(tmp_path / "w.sock"))
    try:
        start = links.generation
        (fd,) = _accepted(links)
        assert links.generation != start  # a link came
        peer.sendall(frame(b'{"t":"x"}'))
        select.select([fd], [], [], 2.0)
        got = links.readable(fd)
        links.claim(fd, 0)
        assert [payload for _fd, payload in got] == [b'{"t":"x"}']
        steady = links.generation
        links.send(0, b"small")  # taken whole by the socket: nothing to watch
        assert links.generation == steady and links.waiting_fds() == []
        big = b"x" * (1 << 16)
        for _ in range(1000):  # until the socket's buffer is full (the peer reads nothing)
            links.send(0, big)
            if links.waiting_fds():
                break
        assert links.waiting_fds() == [fd] and links.generation != steady  # output waits
        backlog = links.generation
        peer.setblocking(False)
        for _ in range(10_000):  # read everything; the writer sends the rest as it can
            try:
                peer.recv(1 << 20)
            except BlockingIOError:
                links.writable(fd)
                if not links.waiting_fds():
                    break
                select.select([peer], [], [], 0.05)
        assert links.waiting_fds() == [] and links.generation != backlog  # all sent
        sent = links.generation
        peer.close()
        select.select([fd], [], [], 2.0)
        assert links.readable(fd) == []
        assert links.conn_fds() == [] and links.generation != sent  # the link went
    finally:
        peer.close()
        links.close()


def _read(links: ShardConnections, fd: int) -> list[bytes]:
    select.select([fd], [], [], 2.0)
    return [payload for _fd, payload in links.readable(fd)]


def test_frames_are_read_whole_however_the_stream_cuts_them(tmp_path: Path) -> None:
    """A read that holds exactly one frame takes the short way (`ShardConnections.readable`);
    a frame cut across reads, or several in one, must come out the same."""
    links = ShardConnections(str(tmp_path / "w.sock"))
    peer = _connect(str(tmp_path / "w.sock"))
    try:
        (fd,) = _accepted(links)
        peer.sendall(frame(b"one"))
        assert _read(links, fd) == [b"one"]
        two, three = frame(b"two" * 50), frame(b"three")
        peer.sendall(two[:3])  # not even the whole header
        assert _read(links, fd) == []
        peer.sendall(two[3:20])
        assert _read(links, fd) == []
        peer.sendall(two[20:])
        assert _read(links, fd) == [b"two" * 50]
        # A payload that starts like a frame, cut after its own header: its tail is no frame.
        inner = FRAME_HEADER.pack(6) + b"abcdef"
        peer.sendall(frame(inner)[:4])
        assert _read(links, fd) == []
        peer.sendall(frame(inner)[4:])
        assert _read(links, fd) == [inner]
        peer.sendall(three + frame(b"four"))
        assert _read(links, fd) == [b"three", b"four"]
        peer.sendall(frame(b"five") + frame(b"six")[:5])
        assert _read(links, fd) == [b"five"]
        peer.sendall(frame(b"six")[5:])
        assert _read(links, fd) == [b"six"]
        peer.sendall(frame(b""))  # an empty payload: only its header
        peer.sendall(frame(b"seven"))
        got = _read(links, fd)
        got += [] if len(got) == 2 else _read(links, fd)
        assert got == [b"", b"seven"]
    finally:
        peer.close()
        links.close()
