"""The one frame writer (`frame`, `send_frame`) beside the one frame cutter: whatever part of a
frame a socket takes, what it took and what is left make the frame the cutter reads back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.protocol import FRAME_HEADER, FrameCutter, encode, frame, send_frame
from shardq.protocol._frames import pack_body


class _Socket:
    """A `sendmsg` that takes at most `room` bytes, or raises as a full socket does."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.taken = bytearray()
        self.calls = 0

    def sendmsg(self, buffers: tuple[bytes, bytes]) -> int:
        self.calls += 1
        if self.room == 0:
            raise BlockingIOError
        data = b"".join(buffers)[: self.room]
        self.taken += data
        return len(data)


def _cut(stream: bytes) -> list[bytes]:
    return FrameCutter().cut(stream, bytes)


def test_a_frame_is_its_length_then_its_body() -> None:
    body = pack_body({"cmd": "Ping"})
    assert frame(body) == FRAME_HEADER.pack(len(body)) + body
    assert encode({"cmd": "Ping"}) == frame(body)


@settings(max_examples=80, deadline=None)
@given(body=st.binary(max_size=300), room=st.integers(1, 400))
def test_what_the_socket_did_not_take_completes_the_frame(body: bytes, room: int) -> None:
    sock = _Socket(room)
    rest = send_frame(sock.sendmsg, body)
    assert sock.calls == 1  # header and body in one call
    assert bytes(sock.taken) + rest == frame(body)
    assert (rest == b"") is (room >= len(body) + 4)
    assert _cut(bytes(sock.taken) + rest + frame(b"next")) == [body, b"next"]


def test_a_full_socket_takes_nothing_and_says_so() -> None:
    with pytest.raises(BlockingIOError):
        send_frame(_Socket(0).sendmsg, b"body")
