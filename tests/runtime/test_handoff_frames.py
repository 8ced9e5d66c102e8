"""Handed-off connections at the byte level (`tcp_handoff`, docs/runtime.md): a frame split
across the handoff travels with the descriptor, frames the shard does not serve go back with
it, and every request gets exactly one reply on the one TCP connection.

Raw sockets against a real server, so that where a frame boundary falls is the test's choice.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from shardq_harness import ShardqServer, poll_until

from shardq.client._tcp import TcpConnection
from shardq.protocol._direct import shard_of

Factory = Callable[..., ShardqServer]
AFTER = 4
ENV = {
    "SHARDQ_TCP_HANDOFF": "true",
    "SHARDQ_TCP_HANDOFF_AFTER": str(AFTER),
    "SHARDQ_TCP_HANDOFF_BACKOFF_MS": "100",
}
WAIT_S = 30.0


def _queue_on(shard: int, prefix: str, shards: int = 2) -> str:
    return next(f"{prefix}-{i}" for i in range(1000) if shard_of(f"{prefix}-{i}", shards) == shard)


def _frame(cmd: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(cmd, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


class _Raw:
    """One TCP connection: frames out, replies (or their bodies) in, in order."""

    def __init__(self, server: ShardqServer) -> None:
        self.sock = socket.create_connection(server.tcp_address, timeout=WAIT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""

    def bodies(self, count: int) -> list[bytes]:
        """The next `count` reply frames' bodies, as the server wrote them."""
        out: list[bytes] = []
        while len(out) < count:
            while len(self._buf) >= 4:
                (size,) = struct.unpack(">I", self._buf[:4])
                if len(self._buf) < 4 + size:
                    break
                out.append(self._buf[4 : 4 + size])
                self._buf = self._buf[4 + size :]
            if len(out) < count:
                data = self.sock.recv(65536)
                assert data, f"the connection closed after {len(out)} of {count} replies"
                self._buf += data
        return out

    def replies(self, count: int) -> list[dict[str, Any]]:
        return [msgpack.unpackb(body, raw=False) for body in self.bodies(count)]

    def send(self, cmds: list[dict[str, Any]]) -> None:
        self.sock.sendall(b"".join(_frame(c) for c in cmds))

    def call_bodies(self, cmds: list[dict[str, Any]]) -> list[bytes]:
        self.send(cmds)
        return self.bodies(len(cmds))

    def call(self, cmds: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.send(cmds)
        return self.replies(len(cmds))


def _stats(server: ShardqServer) -> dict[str, Any]:
    with TcpConnection(*server.tcp_address) as conn:
        stats: dict[str, Any] = conn.call({"cmd": "Stats"})["stats"]
        return stats


def _announced(server: ShardqServer) -> ShardqServer:
    with TcpConnection(*server.tcp_address) as conn:
        poll_until(
            lambda: "directPorts" in conn.call({"cmd": "Hello", "protocolVersion": 3}),
            WAIT_S,
            "the direct ports announced",
        )
    return server


def _started(
    factory: Factory, env: dict[str, str] | None = None, data_dir: Path | None = None
) -> ShardqServer:
    return _announced(factory(shards=2, env={**ENV, **(env or {})}, data_dir=data_dir))


@contextlib.contextmanager
def shared_server(
    tmp: pytest.TempPathFactory, name: str, env: dict[str, str] | None = None
) -> Iterator[ShardqServer]:
    """One two-shard server with `ENV` (and `env`) for a module's tests that neither kill,
    stop nor reconfigure it (each has queues of its own and reads Stats' handoff counts as
    differences from `_settled`); stopped cleanly (exit 0) at the end."""
    data = tmp.mktemp(name) / "data"
    with ShardqServer(data, shards=2, env={**ENV, **(env or {})}).start() as server:
        yield _announced(server)
        assert server.stop() == 0, server.log_tail()


def _settled(server: ShardqServer) -> dict[str, Any]:
    """Stats once `handedOff` and `handedBack` have stayed put for 0.3 s: a connection an
    earlier test on the server closed (or handed back) moves them no more, so that what a
    test reads after it is its own doing."""
    last: tuple[int, int] | None = None
    deadline = time.monotonic() + WAIT_S
    while True:
        stats = _stats(server)
        now = (stats["handedOff"], stats["handedBack"])
        if now == last:
            return stats
        assert time.monotonic() < deadline, f"the handoff counts never settled: {now}"
        last = now
        time.sleep(0.3)


def _push(queue: str, n: int) -> dict[str, Any]:
    return {"cmd": "PUSH", "queue": queue, "data": {"n": n}, "reqId": f"p{n}"}


@pytest.fixture(scope="module")
def frames_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """Shared by the three tests below with the default settings (queues split, order and
    bulk): two server starts fewer."""
    with shared_server(tmp_path_factory, "frames") as server:
        yield server


def test_a_frame_split_across_the_handoff_is_served_whole(frames_server: ShardqServer) -> None:
    server = frames_server
    queue = _queue_on(0, "split")
    off = _settled(server)["handedOff"]
    raw = _Raw(server)
    try:
        # AFTER pushes and the first half of one more, in one write: the front end hands the
        # connection off with that half in hand.
        half = _frame(_push(queue, AFTER))
        raw.sock.sendall(b"".join(_frame(_push(queue, i)) for i in range(AFTER)) + half[:7])
        assert [r["reqId"] for r in raw.replies(AFTER)] == [f"p{i}" for i in range(AFTER)]
        poll_until(lambda: _stats(server)["handedOff"] == off + 1, WAIT_S, "the handoff")
        before = _stats(server)["directRequests"]
        raw.sock.sendall(half[7:])
        (reply,) = raw.replies(1)
        assert reply["ok"] is True and reply["reqId"] == f"p{AFTER}"
        assert _stats(server)["directRequests"] == before + 1
    finally:
        raw.sock.close()


def test_unserved_frames_go_back_with_the_connection_in_order(
    frames_server: ShardqServer,
) -> None:
    server = frames_server
    mine, other = _queue_on(1, "order"), _queue_on(0, "order")
    settled = _settled(server)
    off, back = settled["handedOff"], settled["handedBack"]
    raw = _Raw(server)
    try:
        raw.call([_push(mine, i) for i in range(AFTER)])
        poll_until(lambda: _stats(server)["handedOff"] == off + 1, WAIT_S, "the handoff")
        # One write: pushes the shard serves, then a command it does not, then more pushes
        # (for another shard's queue too) and a partial frame; all answered once, in order.
        tail = _frame(_push(mine, 99))
        batch = [
            _push(mine, 10),
            _push(mine, 11),
            {"cmd": "GetJobCounts", "queue": mine, "reqId": "counts"},
            _push(mine, 12),
            _push(other, 13),
        ]
        raw.sock.sendall(b"".join(_frame(c) for c in batch) + tail[:5])
        replies = {r.get("reqId"): r for r in raw.replies(len(batch))}
        # Each answered once (pipelined: in the order their shards answer, as ever).
        assert sorted(replies) == ["counts", "p10", "p11", "p12", "p13"]
        assert all(r["ok"] is True for r in replies.values())
        assert replies["counts"]["counts"]["waiting"] == AFTER + 2
        poll_until(lambda: _stats(server)["handedBack"] == back + 1, WAIT_S, "the hand-back")
        raw.sock.sendall(tail[5:])
        (last,) = raw.replies(1)
        assert last["ok"] is True and last["reqId"] == "p99"
        # Back with the front end, after the back-off it is handed off again.
        time.sleep(0.2)
        raw.call([_push(mine, 20 + i) for i in range(AFTER)])
        poll_until(lambda: _stats(server)["handedOff"] == off + 2, WAIT_S, "the second handoff")
    finally:
        raw.sock.close()


def test_bulk_pushes_are_served_by_the_shard_and_counted(frames_server: ShardqServer) -> None:
    server = frames_server
    queue = _queue_on(1, "bulk")
    settled = _settled(server)
    off, back = settled["handedOff"], settled["handedBack"]
    with TcpConnection(*server.tcp_address) as conn:
        pushed = conn.call({"cmd": "Metrics"})["metrics"]["totalPushed"]
    raw = _Raw(server)

    def bulk(n: int, **extra: Any) -> dict[str, Any]:
        jobs = [{"name": "n", "data": {"n": n, "j": j}, **extra} for j in range(10)]
        return {"cmd": "PUSHB", "queue": queue, "jobs": jobs, "reqId": f"b{n}"}

    try:
        assert all(r["ok"] for r in raw.call([bulk(i) for i in range(AFTER)]))
        poll_until(lambda: _stats(server)["handedOff"] == off + 1, WAIT_S, "the handoff")
        before = _stats(server)["directRequests"]
        (reply,) = raw.call([bulk(AFTER)])
        assert reply["ok"] is True and len(reply["ids"]) == 10
        stats = _stats(server)
        assert stats["directRequests"] == before + 1 and stats["handedBack"] == back
        # A PUSHB naming a parent goes back to the front end, which checks the parent.
        (flow,) = raw.call([bulk(99, parentId="nope", parentQueue=queue)])
        assert flow["ok"] is False
        assert _stats(server)["handedBack"] == back + 1
        with TcpConnection(*server.tcp_address) as conn:
            metrics = conn.call({"cmd": "Metrics"})
            counts = conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"]
        assert counts["waiting"] == 10 * (AFTER + 1)
        assert metrics["metrics"]["totalPushed"] - pushed == 10 * (AFTER + 1)
    finally:
        raw.sock.close()


def test_a_connection_the_client_closes_is_released(shardq_server: Factory) -> None:
    # Three connections at most: one the front end failed to release would keep a third new
    # one out.
    server = _started(shardq_server, {"SHARDQ_MAX_CONNECTIONS": "3"})
    queue = _queue_on(0, "closed")
    raw = _Raw(server)
    raw.call([_push(queue, i) for i in range(AFTER)])
    poll_until(lambda: _stats(server)["handedOff"] == 1, WAIT_S, "the handoff")
    raw.sock.close()

    def three_more() -> bool:
        conns: list[_Raw] = []
        try:
            for _ in range(3):
                conns.append(_Raw(server))
                conns[-1].sock.settimeout(2.0)
                assert conns[-1].call([{"cmd": "Ping", "reqId": "x"}])[0]["ok"] is True
            return True
        except (OSError, AssertionError):
            return False
        finally:
            for conn in conns:
                conn.sock.close()

    poll_until(three_more, WAIT_S, "three new connections served (the handed one released)")


def test_a_connection_that_moves_to_another_shards_queues_follows_once(
    shardq_server: Factory,
) -> None:
    # A back-off far longer than the test: only the waiver can hand the connection on.
    server = _started(shardq_server, {"SHARDQ_TCP_HANDOFF_BACKOFF_MS": "600000"})
    first, second = _queue_on(1, "moves"), _queue_on(0, "moves")
    raw = _Raw(server)
    try:
        assert all(r["ok"] for r in raw.call([_push(first, i) for i in range(AFTER)]))
        poll_until(lambda: _stats(server)["handedOff"] == 1, WAIT_S, "the handoff to shard 1")
        # Pushes for shard 0's queue alone: shard 1 hands the connection back, and the front
        # end hands it on to shard 0 without waiting out the back-off.
        assert all(r["ok"] for r in raw.call([_push(second, 10 + i) for i in range(AFTER + 1)]))
        poll_until(lambda: _stats(server)["handedOff"] == 2, WAIT_S, "the handoff to shard 0")
        assert _stats(server)["handedBack"] == 1
        # Moving again within the back-off: back to the front end, which keeps it.
        for batch in range(2):
            pushes = [_push(first, 20 + 10 * batch + i) for i in range(AFTER + 1)]
            assert all(r["ok"] for r in raw.call(pushes))
        stats = _stats(server)
        assert (stats["handedOff"], stats["handedBack"]) == (2, 2)
        with TcpConnection(*server.tcp_address) as conn:
            waiting = [
                conn.call({"cmd": "GetJobCounts", "queue": q})["counts"]["waiting"]
                for q in (first, second)
            ]
        assert waiting == [AFTER + 2 * (AFTER + 1), AFTER + 1]
    finally:
        raw.sock.close()
