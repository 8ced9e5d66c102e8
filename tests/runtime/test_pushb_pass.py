"""A PUSHB passed to its shard as the client's bytes (`[tcp] pushb_pass_through`,
`protocol._rawpush`) answers byte for byte what the general path answers (the front end decodes
it and packs it again), and stores the same jobs.

Two servers of two shards, one with the pass-through and one without, get the same requests one
at a time over raw TCP: valid PUSHBs (plain, with options, durable, custom ids, uniqueKey) and
invalid ones (bad entries, oversize data, flows, bodies that do not decode: bad UTF-8, refused
extension types, non-str keys, duplicated keys, nesting at msgpack's limit, trailing bytes), then
Hypothesis's. The reply frames must be equal with each job id replaced by its position, and
the jobs read back equal. `tcp_handoff` is off on both, so no connection leaves the front end.
"""

from __future__ import annotations

import re
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shardq_harness import ShardqServer

from shardq.protocol import FRAME_HEADER
from shardq.protocol._rawpush import decode_raw_pushb, peek_pushb

REPLY_S = 20.0  # a loaded 2-core machine; a 10 MB body decodes in well under that
# Job ids: UUIDs, or a custom id as given (a custom id here is `c-...`, kept as it is).
_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def _queues() -> tuple[str, str]:
    """One queue on each of two shards (the routing is crc32 of the name)."""
    names = [f"pp{i}" for i in range(40)]
    return (
        next(n for n in names if zlib.crc32(n.encode()) % 2 == 0),
        next(n for n in names if zlib.crc32(n.encode()) % 2 == 1),
    )


QA, QB = _queues()


def _map(items: list[tuple[bytes, bytes]]) -> bytes:
    """A msgpack map of packed keys and values, duplicates kept (as a client could send)."""
    n = len(items)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)
    return head + b"".join(k + v for k, v in items)


def _pushb(queue: Any, jobs: bytes, *extra: tuple[bytes, bytes], req: Any = "keep") -> bytes:
    items = [(_pack("cmd"), _pack("PUSHB")), (_pack("queue"), _pack(queue))]
    items.append((_pack("jobs"), jobs))
    if req != "keep":
        items.append((_pack("reqId"), _pack(req)))
    return _map([*items, *extra])


def _deep(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


def _jobs_with(data: bytes) -> bytes:
    return b"\x92" + _pack({"data": 1}) + b"\x81" + _pack("data") + data


class _Raw:
    """One TCP connection: a body out, its one reply frame's bytes back."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=REPLY_S)

    def call(self, body: bytes) -> bytes:
        self.sock.sendall(FRAME_HEADER.pack(len(body)) + body)
        deadline = time.monotonic() + REPLY_S
        data = b""
        while len(data) < 4 or len(data) < 4 + FRAME_HEADER.unpack_from(data)[0]:
            assert time.monotonic() < deadline, "no reply in time"
            chunk = self.sock.recv(1 << 16)
            assert chunk, "connection closed"
            data += chunk
        assert len(data) == 4 + FRAME_HEADER.unpack_from(data)[0], "one reply at a time"
        return data


class _ZRaw:
    """One ZeroMQ DEALER: a body out as one message, its one reply back (as `_Raw` returns
    it: behind a frame header, so that both transports compare alike)."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.connect(endpoint)

    def call(self, body: bytes) -> bytes:
        self.sock.send(body)
        assert self.sock.poll(int(REPLY_S * 1000)), "no reply in time"
        (reply,) = self.sock.recv_multipart()
        assert not self.sock.poll(0), "one reply at a time"
        return FRAME_HEADER.pack(len(reply)) + reply

    def close(self) -> None:
        self.sock.close(linger=0)


class _Pair:
    """The same server twice: with the pass-through, and without (over TCP, or ZeroMQ)."""

    def __init__(
        self, on: ShardqServer, off: ShardqServer, ctx: zmq.Context[Any] | None = None
    ) -> None:
        self.on: _Raw | _ZRaw
        self.off: _Raw | _ZRaw
        if ctx is None:
            self.on, self.off = _Raw(on.tcp_address), _Raw(off.tcp_address)
        else:
            self.on, self.off = _ZRaw(ctx, on.zmq_endpoint), _ZRaw(ctx, off.zmq_endpoint)
        self.ids: tuple[dict[bytes, int], dict[bytes, int]] = ({}, {})
        self.sent = 0

    def _placed(self, frame: bytes, ids: dict[bytes, int]) -> bytes:
        def place(m: re.Match[bytes]) -> bytes:
            n = ids.setdefault(m.group(0), len(ids))
            return f"{n:036d}".encode()

        return _UUID.sub(place, frame)

    def same(self, body: bytes) -> bytes:
        """Send `body` to both; assert the replies are equal (ids placed); return one."""
        self.sent += 1
        on = self._placed(self.on.call(body), self.ids[0])
        off = self._placed(self.off.call(body), self.ids[1])
        assert msgpack.unpackb(on[4:], raw=False) == msgpack.unpackb(off[4:], raw=False)
        assert on == off
        return on

    def jobs(self, queue: str) -> list[Any]:
        """Every job of `queue` pulled from each server, without what time and ids make
        differ (both pulled in the same order: priority, then arrival), then acked: a
        ZeroMQ peer never closes, so its leases would stay active until their lock ran out
        (30 s), and the shared servers' stop would wait for them."""
        got = []
        for conn in (self.on, self.off):
            cmd = {"cmd": "PULLB", "queue": queue, "count": 1000, "owner": "t"}
            pulled = msgpack.unpackb(conn.call(_pack(cmd))[4:], raw=False, strict_map_key=False)
            assert pulled["ok"] is True, pulled
            got.append([_stable(job) for job in pulled["jobs"]])
            ids = [job["id"] for job in pulled["jobs"]]
            ack = {"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"]}
            acked = msgpack.unpackb(conn.call(_pack(ack))[4:], raw=False, strict_map_key=False)
            assert acked["ok"] is True, acked
        assert got[0] == got[1]
        return got[0]


_TIMES = re.compile(r"(At|On|Until|timestamp|Time|Heartbeat|timeline)$")


def _stable(job: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in job.items()
        if k != "id"
        and not _TIMES.search(k)
        and not (isinstance(v, str) and _UUID.fullmatch(v.encode()))
    }


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ShardqServer]]:
    """With the pass-through, and without."""
    made: list[ShardqServer] = []
    try:
        for on in ("true", "false"):
            env = {"SHARDQ_PUSHB_PASS_THROUGH": on, "SHARDQ_TCP_HANDOFF": "false"}
            data = tmp_path_factory.mktemp(f"pass-{on}")
            made.append(ShardqServer(Path(data), shards=2, env=env).start())
        yield made
        for server in made:
            assert server.stop() == 0
    finally:
        for server in made:
            server.close()


@pytest.fixture(scope="module")
def pair(servers: list[ShardqServer]) -> Iterator[_Pair]:
    pair = _Pair(servers[0], servers[1])
    yield pair
    pair.on.sock.close()
    pair.off.sock.close()


def _cases() -> list[bytes]:
    job = _pack
    big = "x" * (10 * 1024 * 1024 + 16)
    cases = [
        _pushb(QA, job([{"data": {"i": i}} for i in range(5)])),
        _pushb(QB, job([{"data": {"i": i}, "name": f"n{i}"} for i in range(3)])),
        _pushb(
            QA,
            job(
                [
                    {"data": 1, "priority": 5, "delay": 0, "attempts": 3, "tags": ["a"]},
                    {"data": [1, 2.5, None, True], "removeOnComplete": True, "lifo": True},
                ]
            ),
        ),
        _pushb(QB, job([{"data": "d1"}, {"data": "d2"}]), (_pack("durable"), _pack(True))),
        _pushb(QA, job([{"data": "dj", "durable": True}])),
        _pushb(QA, job([{"data": 1, "customId": "c-1"}, {"data": 2, "customId": "c-2"}])),
        _pushb(QA, job([{"data": 1, "customId": "c-1"}])),  # again: the same job
        _pushb(QB, job([{"data": 1, "customId": "c-3"}, {"data": 2, "customId": "c-3"}])),
        _pushb(QB, job([{"data": 1, "customId": 17}, {"data": 3, "uniqueKey": "u1"}])),
        _pushb(QB, job([{"data": 4, "uniqueKey": "u1"}])),
        _pushb(QA, job([])),
        _pushb(QA, job("not a list")),
        _pushb(QA, job([1, {"data": 1}])),
        _pushb(QA, job([{"data": 1}, {"data": 2, "priority": "high"}])),
        _pushb(QA, job([{"data": 1, "delay": -5}, {"data": 1, "maxAttempts": 2**63}])),
        _pushb(QA, job([{"data": big}])),  # data over the engine's 10 MB
        _pushb(QA, job([{"data": 1, "parentId": "no-such-parent", "parentQueue": QB}])),
        _pushb(QA, job([{"data": 1, "childrenIds": ["x"]}])),
        _pushb(QA, job([{"data": "mentions parentId in its data"}])),
        _pushb(QA, _jobs_with(b"\xa2\xff\xfe")),  # a str that is not UTF-8
        _pushb(QA, _jobs_with(b"\xd4\x05\x00")),  # a refused ext type
        _pushb(QA, _jobs_with(b"\xd4\x00\x00")),  # JS undefined: nil
        _pushb(QA, _jobs_with(b"\xd6\xff\x00\x00\x00\x01")),  # a timestamp: float seconds
        _pushb(QA, _jobs_with(b"\xca\x3f\xc0\x00\x00")),  # a float32
        _pushb(QA, _jobs_with(b"\x81\xc4\x01k\x01")),  # a bytes key inside data
        _pushb(QA, _jobs_with(b"\x81\x01\x01")),  # an int key inside data
        _pushb(QA, job([{"data": 1}]), (b"\x01", _pack(1))),  # an int key at the top
        _pushb(QA, job([{"data": 1}]), (_pack(b"bin"), _pack(1))),  # a bytes key at the top
        _pushb(QA, job([{"data": 1}]), (_pack("cmd"), _pack("PUSH"))),  # cmd twice
        _pushb(QA, job([{"data": 1}]), (_pack("queue"), _pack(QB))),  # queue twice
        _pushb(QA, job([{"data": 1}]), (_pack("reqId"), _pack("again"))),  # reqId twice
        _pushb(QA, job([{"data": 1}]), (_pack("unknownField"), _pack({"a": [1]}))),
        _pushb(7, job([{"data": 1}])),
        _map([(_pack("cmd"), _pack("PUSHB")), (_pack("jobs"), job([{"data": 1}]))]),
        _map(
            [
                (_pack("cmd"), b"\xd9\x05PUSHB"),  # a str8 "PUSHB"
                (_pack("queue"), _pack(QA)),
                (_pack("jobs"), job([{"data": "str8 cmd"}])),
            ]
        ),
        _pushb(QA, job([{"data": 1}])) + b"\xc0",  # a trailing byte
        _pushb(QA, job([{"data": 1}]))[:-1],  # cut short
        _pushb(QA, job([{"data": 1}]), req=7),
        _pushb(QA, job([{"data": 1}]), req={"n": [1]}),
        _pushb(QA, job([{"data": 1}]), req=None),
        _pushb(QA, job([{"data": 1}]), req="r-plain"),
        # The end of the body looks like a reqId the top-level map does not hold.
        _pushb(QA, job([{"data": {"reqId": "inner"}}])),
        _pushb(QB, job([{"data": ["reqId", 3]}])),
        _pushb(QA, job([{"data": b"\xa5reqId\xcf"}]), req="q"),
        _pushb(QB, job([{"data": 1}]), req=b"\xa5reqId\xa1x"),
        _pushb(QA, job([{"data": 1}]), req="r" * 300),  # past the tail's reach: skipped to
        _pushb(QA, job([{"data": {"reqId": "inner"}}]), req="outer"),
        _pushb(QB, job([{"data": 1}]), req=2**64 - 1),
        _pushb(QB, job([{"data": 1}]), req=-(2**63)),
        _pushb(QA, job([{"data": 1}]), req="é" * 40),
        # A map16 header and no reqId at all (`_with_req` adds none here).
        b"\xde\x00\x03" + _pushb(QB, job([{"data": "no reqId"}]))[1:],
    ]
    for depth in (1010, 1015, 1017, 1018, 1019, 1020, 1021, 1022):
        cases.append(_pushb(QB, _jobs_with(_deep(depth))))
        cases.append(_pushb(QB, job([{"data": 1}]), (_pack("zz"), _deep(depth))))
    return cases


def _with_req(body: bytes, n: int) -> bytes:
    """`body` with a reqId added at its end when it has a map header of its own count."""
    head = body[0]
    if 0x80 <= head < 0x8F and b"reqId" not in body:
        return bytes([head + 1]) + body[1:] + _pack("reqId") + _pack(f"q{n}")
    return body


def test_named_pushbs_answer_as_the_general_path(pair: _Pair) -> None:
    replies = [pair.same(_with_req(body, n)) for n, body in enumerate(_cases())]
    bodies = [msgpack.unpackb(r[4:], raw=False, strict_map_key=False) for r in replies]
    assert sum(b["ok"] is True for b in bodies) >= 15
    errors = {b["error"] for b in bodies if b["ok"] is False}
    assert "Invalid command format" in errors
    assert "Job data too large (max 10MB)" in {e.split(": ", 1)[-1] for e in errors}
    assert any("nested too deeply" in e for e in errors)
    pair.jobs(QA)
    pair.jobs(QB)


def test_named_pushbs_answer_as_the_general_path_over_zeromq(servers: list[ShardqServer]) -> None:
    """The ZeroMQ port peeks at a PUSHB as the TCP port does (`ZmqGateway._decode`): the same
    bodies, the same replies, the same jobs."""
    ctx: zmq.Context[Any] = zmq.Context()
    pair = _Pair(servers[0], servers[1], ctx)
    try:
        replies = [pair.same(_with_req(body, n)) for n, body in enumerate(_cases())]
        assert sum(b"\xa2ok\xc3" in r for r in replies) >= 15  # `ok: true` replies
        pair.jobs(QA)
        pair.jobs(QB)
    finally:
        pair.on.close()
        pair.off.close()
        ctx.term()


# -- Hypothesis: random jobs and options, and bodies cut or spoiled --------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
JOB_KEYS = st.sampled_from(
    ["data", "data", "data", "name", "priority", "delay", "attempts", "maxAttempts", "backoff",
     "customId", "uniqueKey", "durable", "lifo", "removeOnComplete", "tags", "timeout", "ttl",
     "stackTraceLimit", "groupId", "jobId", "dependsOn", "reqId", "cmd"]
)  # fmt: skip
JOBS = st.lists(st.dictionaries(JOB_KEYS, VALUES, min_size=0, max_size=3), max_size=4)
TOP = st.dictionaries(
    st.sampled_from(["durable", "extra", "timeout", "lifo", "name"]), VALUES, max_size=2
)
SPOIL = st.sampled_from(["none", "none", "none", "cut", "trail", "flip"])


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(
    queue=st.sampled_from([QA, QB]),
    jobs=JOBS,
    top=TOP,
    req=st.one_of(st.text(max_size=5), st.integers(0, 9), st.none()),
    spoil=SPOIL,
    where=st.integers(min_value=0),
)
def test_random_pushbs_answer_as_the_general_path(
    pair: _Pair,
    queue: str,
    jobs: list[dict[str, Any]],
    top: dict[str, Any],
    req: Any,
    spoil: str,
    where: int,
) -> None:
    body = _pack({"cmd": "PUSHB", "queue": queue, "jobs": jobs, **top, "reqId": req})
    if spoil == "cut":
        body = body[: max(1, where % len(body))]
    elif spoil == "trail":
        body += b"\xc1"
    elif spoil == "flip":
        at = where % len(body)
        body = body[:at] + bytes([body[at] ^ 0x80]) + body[at + 1 :]
    pair.same(body)


def test_peek_passes_plain_pushbs_and_leaves_the_rest() -> None:
    """What the front end passes through undecoded, what it leaves to the general path, and
    what the shard's one decode sends back there."""
    plain = _pack({"cmd": "PUSHB", "queue": QA, "jobs": [{"data": 1}], "reqId": 5})
    raw = peek_pushb(memoryview(plain))
    assert raw is not None and (raw.queue, raw.req, raw.has_req) == (QA, 5, True)
    assert raw.body == plain
    assert decode_raw_pushb(raw.body) == {"cmd": "PUSHB", "queue": QA, "jobs": [{"data": 1}]}
    raw = peek_pushb(_pack({"cmd": "PUSHB", "queue": QA, "jobs": []}))
    assert raw is not None and raw.has_req is False
    # The jobs are not skipped when no cmd, queue or reqId can follow them.
    first = [
        (_pack("cmd"), _pack("PUSHB")),
        (_pack("reqId"), _pack("r")),
        (_pack("queue"), _pack(QA)),
    ]
    raw = peek_pushb(_map([*first, (_pack("jobs"), b"\x91\xc1")]))
    assert raw is not None and raw.req == "r"
    # A reqId after the jobs is read off the body's end: the jobs are not skipped (this body's
    # one job is a byte no decoder takes), and the shard, which decodes it, refuses it.
    tail = _map([*first[::2], (_pack("jobs"), b"\x91\xc1"), first[1]])
    raw = peek_pushb(tail)
    assert raw is not None and (raw.queue, raw.req, raw.has_req) == (QA, "r", True)
    assert decode_raw_pushb(tail) is None
    # The shard refuses a body whose end looks like a reqId the map does not hold.
    for data in ({"reqId": "inner"}, ["reqId", 3], {"reqId": 2**64 - 1}):
        fake = _pack({"cmd": "PUSHB", "queue": QA, "jobs": [{"data": data}]})
        raw = peek_pushb(fake)
        assert raw is not None and raw.has_req is True
        assert decode_raw_pushb(fake) is None
    # ... or holds with another type or value (the bytes sit inside a bin reqId).
    trick = _pushb(QA, _pack([{"data": 1}]), req=b"\xa5reqId\xa1x")
    raw = peek_pushb(trick)
    assert raw is not None and raw.req == "x" and decode_raw_pushb(trick) is None
    # The last reqId bytes are the guess: earlier ones (in a bin here) do not matter.
    early = _pushb(QA, _pack([{"data": b"\xa5reqId\xcf"}]), req="q")
    raw = peek_pushb(early)
    assert raw is not None and raw.req == "q" and decode_raw_pushb(early) is not None
    assert decode_raw_pushb(_pushb(QA, _pack([{"data": 1}]), req=7)) is not None
    left: list[bytes] = [
        _pack({"cmd": "PUSH", "queue": QA, "data": 1}),
        _pack({"cmd": "PUSHB", "queue": 1, "jobs": []}),
        _pack({"cmd": "PUSHB", "jobs": []}),
        _pack({"cmd": "PUSHB", "queue": QA, "jobs": [{"data": 1, "parentId": "p"}]}),
        _pack({"cmd": "PUSHB", "queue": QA, "jobs": [], "childrenIds": []}),
        _pushb(QA, _pack([]), (_pack("cmd"), _pack("PUSHB"))),
        _pack(["PUSHB"]),
        b"",
    ]
    assert [peek_pushb(body) for body in left] == [None] * len(left)
    refused: list[bytes] = [
        _pushb(QA, _jobs_with(_deep(1019))),  # too deep for the general path's batch
        _pushb(QA, _pack([])) + b"\xc0",
        _pushb(QA, _pack([]))[:-1],
        _pushb(QA, _jobs_with(b"\xa2\xff\xfe")),
        _pushb(QA, _pack([]), (b"\x01", _pack(1))),
    ]
    assert [decode_raw_pushb(body) for body in refused] == [None] * len(refused)
    # One level shallower still fits the general path's batch: the shard takes it.
    assert decode_raw_pushb(_pushb(QA, _jobs_with(_deep(1018)))) is not None
