"""The front end <-> shard link: framing, and both ends over a real Unix socket.

The shard's end (`FrontLink`) is driven from the test's thread with real `select` polls; the
front end's end (`ShardLinks`) runs on a real asyncio loop. Whole-server behaviour over the
link (kill -9 of a shard, a front-end restart, drains) is in test_frontend_shard.py.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardq.runtime.frontend._links import ShardLinks
from shardq.runtime.links._control import pack, unpack
from shardq.runtime.links._stream import (
    MAX_FRAME_BYTES,
    FrameSplitter,
    FrontLink,
    frame,
    read_frames,
    split_batch,
    write_frame,
)


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=40),
)
def test_frames_survive_any_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    splitter = FrameSplitter()
    out: list[bytes] = []
    pos = 0
    for cut in cuts:
        out.extend(splitter.feed(stream[pos : pos + cut]))
        pos += cut
    out.extend(splitter.feed(stream[pos:]))
    assert out == payloads


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=40),
)
def test_frames_fed_from_a_reused_buffer_stay_whole(payloads: list[bytes], cuts: list[int]) -> None:
    # read_frames feeds views of one receive buffer that the next read overwrites.
    stream = b"".join(frame(p) for p in payloads)
    reused = bytearray(64)
    splitter = FrameSplitter()
    out: list[bytes] = []
    sizes = iter(cuts)
    pos = 0
    while pos < len(stream):
        piece = stream[pos : pos + min(next(sizes, len(reused)), len(reused))]
        pos += len(piece)
        reused[: len(piece)] = piece
        out.extend(splitter.feed(memoryview(reused)[: len(piece)]))
        reused[:] = b"\xee" * len(reused)
    assert out == payloads


def test_a_frame_larger_than_the_socket_buffer_arrives_whole() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        left.setblocking(False)
        right.setblocking(False)
        big = bytes(range(256)) * 20_000  # 5 MB: far more than a socket buffer holds
        got: list[bytes] = []

        def read() -> None:
            splitter = FrameSplitter()
            while len(got) < 2:
                select.select([right], [], [], 5.0)
                payloads, lost = read_frames(right, splitter)
                assert lost is None
                got.extend(payloads)

        reader = threading.Thread(target=read)
        reader.start()
        assert write_frame(left, big, block=True)
        assert write_frame(left, b"after", block=True)
        reader.join(10)
        assert got == [big, b"after"]


def test_a_non_blocking_write_to_a_full_socket_writes_nothing() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        left.setblocking(False)
        right.setblocking(False)
        sent = 0
        while write_frame(left, b"x" * 1000, block=False):
            sent += 1
        assert not write_frame(left, b"y" * 1000, block=False)
        splitter, got = FrameSplitter(), []
        while len(got) < sent:
            payloads, lost = read_frames(right, splitter)
            assert lost is None
            got.extend(payloads)
        assert got == [b"x" * 1000] * sent
        assert read_frames(right, splitter) == ([], None)  # no half frame was left behind


def test_a_lying_length_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        FrameSplitter().feed(struct.pack(">I", MAX_FRAME_BYTES + 1) + b"x")


def _read_until(link: FrontLink, count: int, timeout: float = 5.0) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < count:
        ready, _, _ = select.select(link.fds(), [], [], timeout)
        assert ready, f"only {len(got)} of {count} frames arrived"
        for fd in ready:
            got.extend(link.readable(fd))
    return got


class _Events:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.down: list[int] = []
        self.up: list[int] = []
        self.blocked: list[bool] = []

    def links(self, path: Path, max_frame: int = MAX_FRAME_BYTES) -> ShardLinks:
        return ShardLinks(
            [str(path)],
            asyncio.get_running_loop(),
            on_message=self.messages.append,
            on_down=self.down.append,
            on_up=self.up.append,
            on_blocked=self.blocked.append,
            max_frame=max_frame,
        )


async def _until(check: Any, what: str, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def test_both_ends_talk_push_back_and_notice_loss(tmp_path: Path) -> None:
    path = tmp_path / "link-0"

    async def scenario() -> None:
        shard = FrontLink(str(path))
        events = _Events()
        links = events.links(path)
        await links.connect_all()
        assert events.up == [0]
        # The shard accepts on its next poll; then requests and replies flow both ways.
        links.send(0, pack({"t": "req", "items": [["c1", 1, {"cmd": "Ping"}]]}))
        await asyncio.sleep(0)
        (request,) = await asyncio.to_thread(_read_until, shard, 1)
        assert unpack(request)["items"] == [["c1", 1, {"cmd": "Ping"}]]
        assert shard.send(pack({"t": "rep", "items": [["c1", 1, {"ok": True}]]}))
        await _until(lambda: events.messages, "the reply")
        assert events.messages == [{"t": "rep", "items": [["c1", 1, {"ok": True}]]}]

        # A shard that stops reading makes the front end stop reading its clients, and
        # reading again lets them go: the link buffers a bounded amount, never everything.
        big = pack({"t": "req", "items": [["c", 0, {"data": "x" * 1_000_000}]]})
        sent = 0
        while not events.blocked:
            links.send(0, big)
            sent += 1
            await asyncio.sleep(0)
            assert sent < 1000, "writing never paused"
        assert events.blocked == [True]
        await asyncio.to_thread(_read_until, shard, sent, 30.0)
        await _until(lambda: events.blocked == [True, False], "writing to resume")

        # A dead shard is noticed at once; after a restart the link comes back on request.
        shard.close()
        await _until(lambda: events.down == [0], "the link loss")
        links.send(0, pack({"t": "req", "items": []}))  # dropped, not raised
        restarted = FrontLink(str(path))
        links.reconnect(0)
        await _until(lambda: events.up == [0, 0], "the reconnect")
        links.send(0, pack({"t": "drain"}))
        await asyncio.sleep(0)
        (drain,) = await asyncio.to_thread(_read_until, restarted, 1)
        assert unpack(drain) == {"t": "drain"}
        links.close()
        restarted.close()

    asyncio.run(scenario())


def test_the_front_end_takes_every_good_message_and_drops_a_link_over_its_limit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "link-0"

    async def scenario() -> None:
        shard = FrontLink(str(path))
        events = _Events()
        links = events.links(path, max_frame=400_000)
        await links.connect_all()
        ready, _, _ = await asyncio.to_thread(select.select, shard.fds(), [], [], 5.0)
        for fd in ready:
            shard.readable(fd)  # accepts the front end
        # A pass-through reply's bytes, over several reads: each message is decoded from
        # the read's own buffer, and what it decoded stays whole after the reads that follow.
        wire = bytes(range(256)) * 1000
        frames = [pack({"t": "rep", "n": n, "wire": wire}) for n in range(3)]
        frames += [b"\xc1", pack({"t": "rep", "n": 3})]  # not msgpack: dropped alone
        for data in frames:  # a blocking send: from a thread, while this loop reads
            assert await asyncio.to_thread(shard.send, data)
        await _until(lambda: len(events.messages) == 4, "the four good messages")
        assert [m["n"] for m in events.messages] == [0, 1, 2, 3]
        assert all(m["wire"] == wire for m in events.messages[:3])
        assert events.down == []
        # A frame over the front end's limit: the link is corrupt, dropped, then made again.
        sending = asyncio.to_thread(shard.send, pack({"t": "rep", "wire": wire * 2}))
        sent = asyncio.ensure_future(sending)
        await _until(lambda: events.down == [0], "the link to drop")
        await sent  # a write cut short by the drop: False, or True if it all fit
        assert len(events.messages) == 4
        links.close()
        shard.close()

    asyncio.run(scenario())


def test_a_new_front_end_replaces_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "link-0"

    async def scenario() -> None:
        shard = FrontLink(str(path))
        first, second = _Events(), _Events()
        old = first.links(path)
        await old.connect_all()
        select.select(shard.fds(), [], [], 1.0)
        for fd in shard.fds():
            shard.readable(fd)  # accepts the first front end
        new = second.links(path)
        await new.connect_all()
        await asyncio.sleep(0.05)
        ready, _, _ = select.select(shard.fds(), [], [], 1.0)
        for fd in ready:
            shard.readable(fd)  # accepts the second, dropping the first
        await _until(lambda: first.down == [0], "the old link to close")
        assert shard.send(pack({"t": "rep", "items": []}))
        await _until(lambda: second.messages, "the reply on the new link")
        assert first.messages == []
        new.close()
        old.close()
        shard.close()

    asyncio.run(scenario())


def test_replies_without_a_front_end_are_dropped(tmp_path: Path) -> None:
    shard = FrontLink(str(tmp_path / "link-0"))
    assert shard.send(pack({"t": "rep", "items": []})) is False
    assert shard.fds() == shard.fds()[:1]
    shard.close()


def test_a_link_dropped_by_a_live_shard_reconnects_by_itself(tmp_path: Path) -> None:
    path = tmp_path / "link-0"

    async def pump(shard: FrontLink, done: Any, what: str) -> None:
        """Run the shard's side (accept, read) until `done()`."""
        deadline = asyncio.get_running_loop().time() + 5
        while not done():
            ready, _, _ = await asyncio.to_thread(select.select, shard.fds(), [], [], 0.05)
            for fd in ready:
                shard.readable(fd)
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"

    async def scenario() -> None:
        shard = FrontLink(str(path), max_frame=1024)
        events = _Events()
        links = events.links(path)
        await links.connect_all()
        # A frame over the shard's limit makes it drop the link, while it keeps running.
        links.send(0, pack({"t": "req", "items": [["c", 1, {"data": "x" * 4096}]]}))
        await pump(shard, lambda: events.down, "the link to drop")
        assert events.down == [0]
        # No supervisor message: the front end connects again on its own, and the shard
        # takes requests on the new link.
        await pump(shard, lambda: events.up == [0, 0], "the link to come back")
        links.send(0, pack({"t": "drain"}))
        await asyncio.sleep(0)
        (drain,) = await asyncio.to_thread(_read_until, shard, 1)
        assert unpack(drain) == {"t": "drain"}
        links.close()
        shard.close()

    asyncio.run(scenario())


@given(st.lists(st.binary(max_size=300), max_size=40), st.integers(min_value=64, max_value=2000))
def test_a_split_batch_keeps_every_item_in_order_under_the_limit(
    items: list[bytes], limit: int
) -> None:
    packed = [msgpack.packb(item) for item in items]
    frames = split_batch("rep", packed, limit)
    got: list[bytes] = []
    for data in frames:
        msg = unpack(data)
        assert msg["t"] == "rep" and msg["items"]
        # Only an item too large for any frame may make a frame go over, and then alone.
        assert len(data) <= limit or len(msg["items"]) == 1
        got.extend(msg["items"])
    assert got == items


def _accept_all(shard: FrontLink) -> None:
    """One poll of the shard's descriptors, serving what is ready (accepts included)."""
    ready, _, _ = select.select(shard.fds(), [], [], 2.0)
    assert ready, "nothing was ready"
    for fd in ready:
        shard.readable(fd)


def test_the_polled_descriptors_follow_the_connection(tmp_path: Path) -> None:
    path = str(tmp_path / "link-0")
    shard = FrontLink(path, max_frame=1024)
    listener_only = shard.fds()
    assert len(listener_only) == 1
    first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    second = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        first.connect(path)
        _accept_all(shard)
        with_first = shard.fds()
        assert len(with_first) == 2 and with_first[0] == listener_only[0]
        assert listener_only == [listener_only[0]]  # a list handed out earlier did not change
        second.connect(path)  # a new front end replaces the first
        _accept_all(shard)
        with_second = shard.fds()
        assert len(with_second) == 2 and with_second == shard.fds()
        assert first.recv(1) == b""  # the first was closed by the shard
        # A frame over the limit drops the link: only the listener is polled again.
        second.sendall(struct.pack(">I", 4096) + b"x" * 4096)
        _accept_all(shard)
        assert shard.fds() == listener_only
        # It still accepts: a third connection is heard on the listener.
        third = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with third:
            third.connect(path)
            _accept_all(shard)
            assert len(shard.fds()) == 2
            assert shard.send(pack({"t": "rep", "items": []}))
    finally:
        first.close()
        second.close()
        shard.close()
    assert shard.fds() == []  # closed: nothing to poll
