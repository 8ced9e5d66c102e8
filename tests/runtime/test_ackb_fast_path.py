"""An ACKB whose jobs the front end's cache places on one shard goes to that shard whole, and
its reply back as it is (`Router._by_ids`). It must answer byte for byte what the general path
answers: the same requests to a server with no job cache (`job_cache_size = 0`: every id is
looked up on every shard and the parts' replies combined) give the same reply frames, errors
and ignored indices included."""

from __future__ import annotations

import socket
import time
import zlib
from collections.abc import Callable
from typing import Any

import msgpack  # type: ignore[import-untyped]
from shardq_harness import ShardqServer

from shardq.protocol import FRAME_HEADER, encode

Factory = Callable[..., ShardqServer]


def _queues() -> tuple[str, str]:
    """One queue on each of two shards (the routing is crc32 of the name)."""
    names = [f"q{i}" for i in range(20)]
    first = next(n for n in names if zlib.crc32(n.encode()) % 2 == 0)
    second = next(n for n in names if zlib.crc32(n.encode()) % 2 == 1)
    return first, second


class _Raw:
    """One TCP connection that keeps each reply frame's bytes."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=10.0)
        self.n = 0

    def call(self, msg: dict[str, Any]) -> bytes:
        self.n += 1
        self.sock.sendall(encode({**msg, "reqId": f"r{self.n}"}))
        deadline = time.monotonic() + 10.0
        data = b""
        while len(data) < FRAME_HEADER.size or len(data) < FRAME_HEADER.size + _size(data):
            assert time.monotonic() < deadline, "no reply in time"
            chunk = self.sock.recv(1 << 16)
            assert chunk, "connection closed"
            data += chunk
        assert len(data) == FRAME_HEADER.size + _size(data), "one reply at a time"
        return data

    def close(self) -> None:
        self.sock.close()


def _size(data: bytes) -> int:
    size: int = FRAME_HEADER.unpack_from(data)[0]
    return size


def _body(frame: bytes) -> Any:
    return msgpack.unpackb(frame[FRAME_HEADER.size :], raw=False)


def _session(server: ShardqServer) -> list[bytes]:
    """The same requests on any server; the reply frames with each job id replaced by its
    position (ids are UUIDs of one length, so the frames stay valid and comparable)."""
    conn = _Raw(server.tcp_address)
    frames: list[bytes] = []
    ids: list[str] = []
    for queue in _queues():
        conn.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": {"i": i}} for i in range(6)]})
        pulled = _body(conn.call({"cmd": "PULLB", "queue": queue, "count": 6, "owner": "w"}))
        got, tokens = [j["id"] for j in pulled["jobs"]], pulled["tokens"]
        assert len(got) == 6
        ids += got
        acks = [
            {"ids": got[0:2], "tokens": tokens[0:2]},  # applied
            {"ids": got[0:2], "tokens": tokens[0:2]},  # again: both ignored, by index
            {"ids": [got[2], got[2]], "tokens": [tokens[2], tokens[2]]},  # one job twice
            {"ids": got[3:5], "tokens": tokens[3:4]},  # lengths differ: the engine's error
            {"ids": got[3:5], "tokens": tokens[3:5], "results": [{"r": 1}, None]},
            {"ids": [got[0], got[5]], "tokens": [tokens[0], tokens[5]]},  # one ignored
            {"ids": [got[5]], "tokens": ["wrong"]},  # a lease error, after it completed
        ]
        frames += [conn.call({"cmd": "ACKB", **ack}) for ack in acks]
        # A delivery the timeout sweep retired is ignored, by index.
        jobs = [{"data": "timed", "timeout": 50}, {"data": "plain"}]
        conn.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs})
        pulled = _body(conn.call({"cmd": "PULLB", "queue": queue, "count": 2, "owner": "w"}))
        got = [j["id"] for j in pulled["jobs"]]
        ids += got
        time.sleep(0.5)
        frames.append(conn.call({"cmd": "ACKB", "ids": got, "tokens": pulled["tokens"]}))
    # Ids of both shards in one batch, and an unknown one: the general path on both servers.
    frames.append(conn.call({"cmd": "ACKB", "ids": [ids[0], ids[8]]}))
    frames.append(conn.call({"cmd": "ACKB", "ids": ["no-such-job"]}))
    conn.close()
    placed = []
    for frame in frames:
        for i, job_id in enumerate(ids):
            frame = frame.replace(job_id.encode(), f"{i:0{len(job_id)}d}".encode())
        placed.append(frame)
    return placed


def test_an_ackb_on_one_shard_answers_as_the_general_path(
    shardq_server: Factory, tmp_path: Any
) -> None:
    cached = shardq_server(shards=2, data_dir=tmp_path / "cached")
    uncached = shardq_server(
        shards=2, data_dir=tmp_path / "uncached", env={"SHARDQ_JOB_CACHE_SIZE": "0"}
    )
    fast, general = _session(cached), _session(uncached)
    assert [_body(f) for f in fast] == [_body(f) for f in general]
    assert fast == general
    # The session met every kind of answer it means to compare.
    bodies = [_body(f) for f in fast]
    assert sum(b["ok"] is True and "data" not in b for b in bodies) >= 8
    ignored = [b["data"]["ignoredIndices"] for b in bodies if "data" in b]
    assert ignored == [[0], [0]]
    assert sum(not b["ok"] for b in bodies) == 5
    assert cached.stop() == 0 and uncached.stop() == 0
