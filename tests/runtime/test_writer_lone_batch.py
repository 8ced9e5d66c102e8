"""A durable push's own commit: one batch, confirmed on the writer's shortest path.

`FlushBuffer.committed` takes a lone batch apart from the general per-shard bookkeeping, and
`FlushBuffer.replies` answers at once while no waiting batch carries replies; the writer's
end of a shard link (`ShardConnections.send`) hands a frame straight to the socket when
nothing waits before it, keeping only what the socket did not take. Both ends here are the
real link over a real Unix socket.
"""

from __future__ import annotations

import select
import socket
import time
from pathlib import Path

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core import Mutation
from shardq.runtime.links._stream import FrameSplitter, read_frames
from shardq.runtime.links._writer import ShardConnections
from shardq.runtime.writer._flush import FULL_REASON, FlushBuffer
from shardq.storage import StorageFull

WAIT_S = 10.0


def put(n: int) -> Mutation:
    return ("put", {"id": f"j{n}", "queue": "q", "state": "waiting", "seq": n})


def test_a_lone_batch_gets_its_own_done_with_what_the_writer_answered() -> None:
    buffer = FlushBuffer(60.0, 100)
    buffer.add_muts(3, 9, [put(1)], 0.0, urgent=True)
    assert buffer.committed() == [(3, {"t": "done", "seq": 9})]
    assert buffer.pending == 0 and buffer.pending_batches == 0 and buffer.deadline() is None
    buffer.add_muts(3, 10, [put(2)], 1.0, urgent=True, rep=b"r10")
    assert buffer.committed({3: [10]}) == [(3, {"t": "done", "seq": 10, "answered": [10]})]
    # Another shard's answers are not this one's.
    buffer.add_muts(3, 11, [put(3)], 2.0, urgent=True)
    assert buffer.committed({4: [7]}) == [(3, {"t": "done", "seq": 11})]
    assert buffer.deadline() is None and not buffer.storage_full


def test_a_lone_batch_behind_a_sync_leaves_the_sync_its_answer() -> None:
    buffer = FlushBuffer(60.0, 100)
    buffer.add_muts(0, 4, [put(1)], 0.0)
    buffer.add_sync(1, 0, 0.5)
    assert buffer.committed() == [
        (1, {"t": "done", "seq": 0, "sync": True}),
        (0, {"t": "done", "seq": 4}),
    ]


def test_replies_are_those_the_waiting_batches_carry_until_they_go() -> None:
    buffer = FlushBuffer(60.0, 100)
    buffer.add_muts(0, 1, [put(1)], 0.0, urgent=True)
    assert buffer.replies(set()) == []
    buffer.add_muts(1, 1, [put(2)], 0.0, urgent=True, rep=b"r1")
    buffer.add_muts(0, 2, [put(3)], 0.0, urgent=True, rep=b"r2")
    assert buffer.replies(set()) == [(1, 1, b"r1"), (0, 2, b"r2")]
    assert buffer.replies({(0, 2)}) == [(1, 1, b"r1")]
    buffer.committed()
    buffer.add_muts(0, 3, [put(4)], 1.0, urgent=True)
    assert buffer.replies(set()) == []  # the committed batches' replies went with them


def test_durable_batches_dropped_on_a_full_disk_take_their_replies_along() -> None:
    buffer = FlushBuffer(60.0, 100)
    buffer.add_muts(0, 1, [put(1)], 0.0)  # buffered: kept through the failure
    buffer.add_muts(0, 2, [put(2)], 0.0, urgent=True, rep=b"r2")
    assert buffer.failed(StorageFull("full"), 0.0) == [
        (0, {"t": "fail", "seq": 1, "error": FULL_REASON}),
        (0, {"t": "fail", "seq": 2, "error": FULL_REASON}),
    ]
    assert buffer.pending_batches == 1
    assert buffer.replies(set()) == []


def _read(sock: socket.socket, splitter: FrameSplitter, want: int, out: list[bytes]) -> None:
    deadline = time.monotonic() + WAIT_S
    while len(out) < want and time.monotonic() < deadline:
        select.select([sock], [], [], 0.05)
        payloads, lost = read_frames(sock, splitter)
        assert lost is None
        out.extend(payloads)


def test_a_frame_the_socket_cannot_take_whole_goes_out_whole_and_in_order(
    tmp_path: Path,
) -> None:
    links = ShardConnections(str(tmp_path / "w"))
    shard = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        shard.connect(str(tmp_path / "w"))
        shard.setblocking(False)
        (fd,) = _accepted(links)
        links.claim(fd, 0)
        small = msgpack.packb({"t": "done", "seq": 1})
        assert links.send(0, small) and not links.waiting_fds()  # taken at once, all of it
        big = bytes(range(256)) * 8_000  # 2 MB: more than the socket buffer takes at once
        assert links.send(0, big)
        assert links.waiting_fds() == [fd]  # the rest waits in the link, not lost
        got: list[bytes] = []
        splitter = FrameSplitter()
        select.select([shard], [], [], WAIT_S)
        payloads, lost = read_frames(shard, splitter)  # room in the socket again ...
        assert lost is None
        got.extend(payloads)
        assert links.send(0, b"after")  # ... yet this goes behind the rest, never before it
        deadline = time.monotonic() + WAIT_S
        while links.waiting_fds() and time.monotonic() < deadline:
            select.select([shard], [], [], 0.05)
            payloads, lost = read_frames(shard, splitter)  # what the socket holds, no more
            assert lost is None
            got.extend(payloads)
            links.writable(fd)
        _read(shard, splitter, 3, got)
        assert got == [small, big, b"after"]
        assert not links.waiting_fds()
    finally:
        shard.close()
        links.close()


def _accepted(links: ShardConnections) -> list[int]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        select.select([links.listener_fd()], [], [], 0.05)
        if new := links.accept():
            return new
    raise AssertionError("the shard's connection was not accepted")
