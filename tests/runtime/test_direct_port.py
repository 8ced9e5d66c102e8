"""`DirectPort` on its own (no server): requests in, replies split out of a shard's `rep` batch.

The front end's items in a batch must pass through untouched and in order; the port's own
(negative rids) go to their connections with their `reqId`.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
import zmq

from shardq.protocol._direct import DIRECT_REFUSED, direct_goodbye, shard_of
from shardq.runtime import _messages as msgs
from shardq.runtime.shard._direct import DIRECT_CONN_PREFIX, DirectPort


@pytest.fixture
def port() -> Iterator[tuple[DirectPort, zmq.Poller]]:
    poller = zmq.Poller()
    direct = DirectPort(
        "127.0.0.1", 0, 2, poller, max_connections=4, max_frame_bytes=1 << 20, max_write_bytes=0
    )
    yield direct, poller
    direct.close()


def _frame(cmd: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(cmd)
    return struct.pack(">I", len(body)) + body


def _serve_until(direct: DirectPort, poller: zmq.Poller, want: int) -> list[list[Any]]:
    items: list[list[Any]] = []
    deadline = time.monotonic() + 10
    while len(items) < want and time.monotonic() < deadline:
        items += direct.serve(dict(poller.poll(100)))
    return items


def _read(sock: socket.socket) -> dict[str, Any]:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        chunk = sock.recv(65536)
        assert chunk, "closed"
        data += chunk
    reply: dict[str, Any] = msgpack.unpackb(data[4:])
    return reply


def test_pushes_become_requests_and_replies_leave_the_batch(
    port: tuple[DirectPort, zmq.Poller],
) -> None:
    direct, poller = port
    queue = next(f"q{i}" for i in range(100) if shard_of(f"q{i}", 2) == 0)
    with socket.create_connection(("127.0.0.1", direct.port), timeout=5) as sock:
        sock.sendall(_frame({"cmd": "PUSH", "queue": queue, "data": 1, "reqId": "a"}))
        sock.sendall(_frame({"cmd": "PULL", "queue": queue, "reqId": "b"}))
        items = _serve_until(direct, poller, 1)
        assert len(items) == 1
        conn, rid, cmd = items[0]
        assert conn.startswith(DIRECT_CONN_PREFIX) and rid < 0
        assert cmd == {"cmd": "PUSH", "queue": queue, "data": 1}  # reqId kept by the port
        refused = _read(sock)  # the PULL is answered at once, applied nowhere
        assert refused["reqId"] == "b" and refused["error"].startswith(DIRECT_REFUSED)
        front = [["t1.1", 7, {"ok": True}], ["t1.2", 8, {"ok": False, "error": "x"}]]
        batch = msgs.rep([front[0], [conn, rid, {"ok": True, "id": "j1"}], front[1]])
        rest = direct.take(batch)
        assert rest is not None and rest["items"] == front
        assert _read(sock) == {"ok": True, "id": "j1", "reqId": "a"}
        assert direct.inflight == {} and direct.served == 1
        # A batch of the front end's alone goes on as it is; one of the port's alone, not at all.
        assert direct.take(msgs.rep(list(front))) == msgs.rep(front)
        sock.sendall(_frame({"cmd": "PUSH", "queue": queue, "data": 2}))
        (item,) = _serve_until(direct, poller, 1)
        assert direct.take(msgs.rep([[item[0], item[1], {"ok": True, "id": "j2"}]])) is None
        assert _read(sock) == {"ok": True, "id": "j2"}


def test_connections_past_the_cap_are_closed(port: tuple[DirectPort, zmq.Poller]) -> None:
    direct, poller = port
    socks = [socket.create_connection(("127.0.0.1", direct.port), timeout=5) for _ in range(5)]
    try:
        deadline = time.monotonic() + 10
        closed: list[socket.socket] = []
        while not closed and time.monotonic() < deadline:
            direct.serve(dict(poller.poll(50)))
            for s in socks:
                s.setblocking(False)
                try:
                    if s.recv(1) == b"":
                        closed.append(s)
                except BlockingIOError:
                    pass
        assert len(closed) == 1  # the fifth: the cap is 4
    finally:
        for s in socks:
            s.close()


def test_a_silent_or_slow_connection_is_closed() -> None:
    poller = zmq.Poller()
    direct = DirectPort(
        "127.0.0.1", 0, 1, poller, max_connections=4, max_frame_bytes=1 << 20,
        max_write_bytes=0, handshake_s=0.2, frame_s=0.2,
    )  # fmt: skip
    try:
        silent = socket.create_connection(("127.0.0.1", direct.port), timeout=5)
        slow = socket.create_connection(("127.0.0.1", direct.port), timeout=5)
        done = socket.create_connection(("127.0.0.1", direct.port), timeout=5)
        slow.sendall(_frame({"cmd": "PUSH", "queue": "q", "data": 1})[:5])  # half a frame
        done.sendall(_frame({"cmd": "PUSH", "queue": "q", "data": 1}))
        items = []
        deadline = time.monotonic() + 10
        while len(direct._conns) != 1 and time.monotonic() < deadline:
            items += direct.serve(dict(poller.poll(direct.poll_timeout(500))))
        assert len(items) == 1  # the whole frame was taken
        assert [c.name for c in direct._conns.values()] == [items[0][0]]  # the others closed
        for sock in (silent, slow):
            assert sock.recv(10) == b""
        assert direct.poll_timeout(None) is None  # nothing left to watch
        for sock in (silent, slow, done):
            sock.close()
    finally:
        direct.close()


def _read_frames(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    unpacker = msgpack.Unpacker()
    data, replies = b"", []
    while len(replies) < count:
        chunk = sock.recv(65536)
        assert chunk, "closed"
        data += chunk
        while len(data) >= 4 and len(data) >= 4 + (size := struct.unpack(">I", data[:4])[0]):
            unpacker.feed(data[4 : 4 + size])
            replies.append(unpacker.unpack())
            data = data[4 + size :]
    return replies


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)


def test_past_its_in_flight_cap_a_connection_is_read_no_further() -> None:
    poller = zmq.Poller()
    direct = DirectPort(
        "127.0.0.1", 0, 1, poller, max_connections=4, max_frame_bytes=1 << 20,
        max_write_bytes=0, max_in_flight=2,
    )  # fmt: skip
    try:
        with socket.create_connection(("127.0.0.1", direct.port), timeout=5) as sock:
            sock.sendall(_frame({"cmd": "PUSH", "queue": "q", "data": 0, "reqId": "0"}))
            first = _serve_until(direct, poller, 1)
            sock.sendall(_frame({"cmd": "PUSH", "queue": "q", "data": 1, "reqId": "1"}))
            first += _serve_until(direct, poller, 1)
            assert len(first) == 2  # the cap: the connection is not read now
            sock.sendall(_frame({"cmd": "PUSH", "queue": "q", "data": 2, "reqId": "2"}))
            assert _serve_until(direct, poller, 1) == []
            # One reply leaves one in flight, half the cap: read again, the waiting push taken.
            direct.take(msgs.rep([[first[0][0], first[0][1], {"ok": True, "id": "a"}]]))
            assert _read(sock) == {"ok": True, "id": "a", "reqId": "0"}
            (third,) = _serve_until(direct, poller, 1)
            assert third[2]["data"] == 2
            replies = [[item[0], item[1], {"ok": True}] for item in (first[1], third)]
            assert direct.take(msgs.rep(replies)) is None
            assert [r["reqId"] for r in _read_frames(sock, 2)] == ["1", "2"]
    finally:
        direct.close()


def test_with_idle_close_a_connection_waiting_for_nothing_is_closed() -> None:
    poller = zmq.Poller()
    direct = DirectPort(
        "127.0.0.1", 0, 1, poller, max_connections=4, max_frame_bytes=1 << 20,
        max_write_bytes=0, handshake_s=30, idle_close_s=0.2,
    )  # fmt: skip
    try:
        answered = socket.create_connection(("127.0.0.1", direct.port), timeout=5)
        waiting = socket.create_connection(("127.0.0.1", direct.port), timeout=5)
        answered.sendall(_frame({"cmd": "PUSH", "queue": "q", "data": 1}))
        (item,) = _serve_until(direct, poller, 1)
        waiting.sendall(_frame({"cmd": "PUSH", "queue": "q", "data": 2}))
        assert len(_serve_until(direct, poller, 1)) == 1
        direct.take(msgs.rep([[item[0], item[1], {"ok": True}]]))
        assert _read(answered) == {"ok": True}
        deadline = time.monotonic() + 10
        while not _closed(answered) and time.monotonic() < deadline:
            direct.serve(dict(poller.poll(direct.poll_timeout(500))))
        assert _closed(answered)  # idle: nothing in flight, nothing sent
        assert not _closed(waiting)  # its push waits for the engine's reply
        assert len(direct._conns) == 1
        for sock in (answered, waiting):
            sock.close()
    finally:
        direct.close()


def _settle(direct: DirectPort, poller: zmq.Poller) -> None:
    """Serve until every ended connection is closed (the shard's `_end_direct` loop)."""
    deadline = time.monotonic() + 10
    while direct.connections and time.monotonic() < deadline:
        assert direct.serve(dict(poller.poll(direct.poll_timeout(100)))) == []


def _read_to_close(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_quiesce_answers_what_was_taken_then_says_goodbye(
    port: tuple[DirectPort, zmq.Poller],
) -> None:
    direct, poller = port
    queue = next(f"q{i}" for i in range(100) if shard_of(f"q{i}", 2) == 0)
    push = {"cmd": "PUSH", "queue": queue, "data": 1}
    socks = [socket.create_connection(("127.0.0.1", direct.port), timeout=5) for _ in range(3)]
    waiting, idle, unconfirmed = socks
    try:
        waiting.sendall(_frame({**push, "reqId": "w"}))
        unconfirmed.sendall(_frame({**push, "reqId": "u"}))
        items = _serve_until(direct, poller, 2)
        idle.sendall(_frame({"cmd": "Ping", "reqId": "p"}))  # refused at once: waits for none
        for _ in range(100):  # served until its answer is out
            assert direct.serve(dict(poller.poll(50))) == []
            if select.select([idle], [], [], 0)[0]:
                break
        assert _read(idle)["reqId"] == "p"
        direct.quiesce()
        with pytest.raises(OSError):  # the listener is closed
            socket.create_connection(("127.0.0.1", direct.port), timeout=5).close()
        waiting.sendall(_frame({**push, "reqId": "late"}))  # never taken
        goodbye = direct_goodbye()
        assert _read_frames(idle, 1) == [goodbye]  # at once: it waits for nothing
        assert direct.serve(dict(poller.poll(100))) == []
        mine = next(item for item in items if direct.inflight[item[1]] == items[0][0])
        direct.take(msgs.rep([[mine[0], mine[1], {"ok": True, "id": "j1"}]]))
        assert _read_frames(waiting, 2) == [{"ok": True, "id": "j1", "reqId": "w"}, goodbye]
        assert direct.abandon() == 1  # the other one's commit never came: no goodbye
        assert _read_to_close(unconfirmed) == b""
        _settle(direct, poller)
        assert direct.connections == 0 and direct.released == 2
        assert _read_to_close(waiting) == b"" and _read_to_close(idle) == b""  # FIN after it
    finally:
        for sock in socks:
            sock.close()


def test_a_push_costs_the_port_no_enum_flag_arithmetic(
    port: tuple[DirectPort, zmq.Poller],
) -> None:
    """pyzmq's poll flags are `enum.IntFlag`s: `events & zmq.POLLIN` built a new flag in
    Python (about 0.5 µs) twice per read, and `_watch` once more; the port tests plain ints."""
    import cProfile
    import pstats

    direct, poller = port
    queue = next(f"q{i}" for i in range(100) if shard_of(f"q{i}", 2) == 0)
    profile = cProfile.Profile()
    with socket.create_connection(("127.0.0.1", direct.port), timeout=5) as sock:
        for n in range(20):
            sock.sendall(_frame({"cmd": "PUSH", "queue": queue, "data": n, "reqId": n}))
            profile.enable()
            [[conn, rid, _cmd]] = _serve_until(direct, poller, 1)
            assert direct.take(msgs.rep([[conn, rid, {"ok": True, "id": f"j{n}"}]])) is None
            profile.disable()
            assert _read(sock)["reqId"] == n
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    flag_ops = {  # (the accept's `socket` makes two enum members once: not per push)
        name: row[1]
        for (path, _line, name), row in stats.items()
        if path.endswith("enum.py") and name in ("__and__", "__or__", "__rand__", "__ror__")
    }
    assert flag_ops == {}  # 40 `__and__` for these 20 pushes before
