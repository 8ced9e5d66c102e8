"""The direct path (issue 24): shardq's client pushes straight to the shard that owns the queue.

Real servers with `direct_shards` on. That a push went direct is read from the server: each
shard counts the requests its direct port took, which Stats sums as `directRequests`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from shardq_harness import ShardqServer, free_port, listening, poll_until

from shardq.client import Queue
from shardq.client._async_connection import AsyncConnection
from shardq.client._connection import Connection
from shardq.client._direct import REFRESH_S, direct_queue
from shardq.client._tcp import TcpConnection
from shardq.protocol._direct import DIRECT_REFUSED, HELLO_DIRECT, HELLO_SHARDS, shard_of

Factory = Callable[..., ShardqServer]
DIRECT_ENV = {"SHARDQ_DIRECT_SHARDS": "true"}
WAIT_S = 30.0


def _queue_on(shard: int, prefix: str, shards: int = 2) -> str:
    return next(f"{prefix}-{i}" for i in range(1000) if shard_of(f"{prefix}-{i}", shards) == shard)


def _url(server: ShardqServer) -> str:
    host, port = server.tcp_address
    return f"tcp://{host}:{port}"


def _hello(server: ShardqServer) -> dict[str, Any]:
    """The Hello reply once every shard has announced its port (they do as the front end
    links up, a moment after ready)."""
    host, port = server.tcp_address
    with TcpConnection(host, port) as conn:

        def announced() -> dict[str, Any] | None:
            reply = conn.call({"cmd": "Hello", "protocolVersion": 3})
            return reply if HELLO_DIRECT in reply else None

        got: dict[str, Any] = poll_until(announced, WAIT_S, "the direct ports in Hello")
        return got


def _direct_requests(server: ShardqServer) -> int:
    host, port = server.tcp_address
    with TcpConnection(host, port) as conn:
        return int(conn.call({"cmd": "Stats"})["stats"]["directRequests"])


@pytest.fixture(scope="module")
def direct_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """One two-shard server with the direct path on, for the tests that neither restart a
    shard nor read a server-wide rate: each uses queues of its own and reads the direct
    requests it made as a difference (`_direct_requests` before and after). Started once
    instead of once per test; stopped cleanly (exit 0) at the end."""
    data = tmp_path_factory.mktemp("direct") / "data"
    with ShardqServer(data, shards=2, env=DIRECT_ENV).start() as server:
        _hello(server)
        yield server
        assert server.stop() == 0, server.log_tail()


def test_single_pushes_go_to_the_owning_shard(direct_server: ShardqServer) -> None:
    server = direct_server
    before = _direct_requests(server)
    hello = _hello(server)
    assert hello[HELLO_SHARDS] == 2 and len(hello[HELLO_DIRECT]) == 2
    queues = [_queue_on(0, "direct"), _queue_on(1, "direct")]
    with Connection(_url(server)) as conn:
        ids = [
            Queue(name, connection=conn).add("n", {"i": i}, {"durable": i % 2 == 0})
            for name in queues
            for i in range(5)
        ]
        assert conn.direct is not None and conn.direct.used == 10
        # Through the front end, the jobs are where they belong.
        for name in queues:
            counts = conn.call({"cmd": "GetJobCounts", "queue": name})["counts"]
            assert counts["waiting"] == 5
        got = conn.call({"cmd": "GetJob", "id": ids[7]})
        assert got["job"]["queue"] == queues[1] and got["job"]["data"] == {"i": 2}
    assert _direct_requests(server) - before == 10


def test_everything_else_still_goes_through_the_front_end(direct_server: ShardqServer) -> None:
    server = direct_server
    before = _direct_requests(server)
    _hello(server)
    queue = _queue_on(0, "others")
    with Connection(_url(server)) as conn:
        pushed = conn.call_many(
            [{"cmd": "PUSH", "queue": queue, "data": i} for i in range(3)]  # pipelined: no
        )
        bulk = conn.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": 1}]})
        parent = conn.call({"cmd": "PUSH", "queue": queue, "data": "p"})["id"]  # direct
        child = conn.call({"cmd": "PUSH", "queue": queue, "data": "c", "parentId": parent})
        assert all(r["ok"] for r in [*pushed, bulk, child])
        assert conn.direct is not None and conn.direct.used == 1
    assert _direct_requests(server) - before == 1


def test_a_durable_direct_push_survives_kill9_of_its_shard(shardq_server: Factory) -> None:
    server = shardq_server(shards=2, env=DIRECT_ENV)
    _hello(server)
    queue = _queue_on(1, "durable")
    with Connection(_url(server)) as conn:
        ids = [Queue(queue, connection=conn).add("n", i, {"durable": True}) for i in range(20)]
        assert conn.direct is not None and conn.direct.used == 20
        old = server.child_pids()["shard-1"]
        os.kill(old, signal.SIGKILL)  # the moment the last reply came: committed before it
        server.wait_child_replaced("shard-1", old, WAIT_S)
        for job_id in ids:
            assert conn.call({"cmd": "GetJob", "id": job_id})["job"]["data"] is not None
        counts = conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"]
        assert counts["waiting"] == 20


def test_a_restarted_shard_falls_back_then_goes_direct_again(shardq_server: Factory) -> None:
    server = shardq_server(shards=2, env=DIRECT_ENV)
    old_ports = _hello(server)[HELLO_DIRECT]
    queue = Queue(_queue_on(0, "restart"), url=_url(server))
    try:
        queue.add("before", 1)
        direct = queue.connection.direct
        assert direct is not None and direct.used == 1
        old = server.child_pids()["shard-0"]
        os.kill(old, signal.SIGKILL)
        server.wait_child_replaced("shard-0", old, WAIT_S)
        # The direct connection is gone: this push goes through the front end, no error.
        queue.add("after", 2, {"durable": True})
        assert direct.used == 1
        new_ports = _hello(server)[HELLO_DIRECT]
        assert new_ports[0] != old_ports[0]  # a restarted shard listens on a new port
        time.sleep(REFRESH_S)

        def direct_again() -> bool:
            queue.add("later", 3)
            return direct.used > 1

        poll_until(direct_again, WAIT_S, "pushes to go direct again")
        assert queue.counts().waiting >= 3
    finally:
        queue.close()


def test_a_zeromq_connection_pushes_direct_too(direct_server: ShardqServer) -> None:
    server = direct_server
    before = _direct_requests(server)
    _hello(server)
    queue = _queue_on(0, "zmq")
    with Connection(f"zmq://127.0.0.1:{server.zmq_port}") as conn:
        for i in range(5):
            assert conn.call({"cmd": "PUSH", "queue": queue, "data": i, "durable": True})["ok"]
        assert conn.direct is not None and conn.direct.used == 5
        assert conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"]["waiting"] == 5
    assert _direct_requests(server) - before == 5
    # With a CURVE key the connection is encrypted, and the direct port is not: never direct.
    secured = Connection(f"zmq://127.0.0.1:{server.zmq_port}", zmq_server_key="x" * 40)
    assert secured.direct is None
    secured.close()


def test_asyncio_connection_pushes_direct(direct_server: ShardqServer) -> None:
    server = direct_server
    before = _direct_requests(server)
    _hello(server)
    queue = _queue_on(1, "aio")

    async def push() -> tuple[list[dict[str, Any]], int]:
        async with AsyncConnection(_url(server)) as conn:
            # The first push connects, which asks for the ports; the others wait for it.
            assert (await conn.call({"cmd": "PUSH", "queue": queue, "data": -1}))["ok"]
            replies = await asyncio.gather(
                *(conn.call({"cmd": "PUSH", "queue": queue, "data": i}) for i in range(10))
            )
            assert conn.direct is not None
            return list(replies), conn.direct.used

    replies, used = asyncio.run(push())
    assert all(r["ok"] for r in replies) and used == 11
    assert _direct_requests(server) - before == 11


def test_asyncio_falls_back_when_its_shard_restarts(shardq_server: Factory) -> None:
    server = shardq_server(shards=2, env=DIRECT_ENV)
    _hello(server)
    queue = _queue_on(1, "aio-restart")

    async def push(conn: AsyncConnection, data: object) -> None:
        reply = await conn.call({"cmd": "PUSH", "queue": queue, "data": data, "durable": True})
        assert reply["ok"], reply

    async def run() -> None:
        async with AsyncConnection(_url(server)) as conn:
            await push(conn, 1)
            assert conn.direct is not None and conn.direct.used == 1
            old = server.child_pids()["shard-1"]
            os.kill(old, signal.SIGKILL)
            await asyncio.to_thread(server.wait_child_replaced, "shard-1", old, WAIT_S)
            await push(conn, 2)  # through the front end: the shard's connection is gone
            assert conn.direct.used == 1
            await asyncio.sleep(REFRESH_S)
            deadline = time.monotonic() + WAIT_S
            while conn.direct.used == 1 and time.monotonic() < deadline:
                await push(conn, 3)
            assert conn.direct.used == 2, "pushes never went direct again"
            counts = (await conn.call({"cmd": "GetJobCounts", "queue": queue}))["counts"]
            assert counts["waiting"] >= 3

    asyncio.run(run())


# -- the direct port itself, raw -------------------------------------------------------------


def _raw(port: int, body: bytes) -> dict[str, Any]:
    """Send one frame made of `body` and read one reply frame."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">I", len(body)) + body)
        return _read_frame(sock)


def _read_frame(sock: socket.socket) -> dict[str, Any]:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed after {data!r}")
        data += chunk
    reply: dict[str, Any] = msgpack.unpackb(data[4:], raw=False)
    return reply


BAD_PUSHES: list[dict[str, Any]] = [
    {"cmd": "PUSH", "data": 1},  # no queue
    {"cmd": "PUSH", "queue": 7, "data": 1},
    {"cmd": "PUSH", "queue": "", "data": 1},
    {"cmd": "PUSH", "queue": "{q}", "data": 1, "priority": "high"},
    {"cmd": "PUSH", "queue": "{q}", "data": 1, "attempts": "x"},
    {"cmd": "PUSH", "queue": "{q}", "data": 1, "durable": "yes"},
    {"cmd": "PUSH", "queue": "{long}", "data": 1},
    {"cmd": "", "queue": "{q}"},
    {"queue": "{q}"},
]


def test_bad_input_gets_the_front_ends_error_strings(direct_server: ShardqServer) -> None:
    server = direct_server
    before = _direct_requests(server)
    ports = _hello(server)[HELLO_DIRECT]
    queue, long = _queue_on(0, "bad"), _queue_on(0, "x" * 300)
    front = server.tcp_address[1]
    for template in BAD_PUSHES:
        cmd = {
            k: (v.format(q=queue, long=long) if isinstance(v, str) else v)
            for k, v in template.items()
        }
        cmd["reqId"] = "r1"
        body = msgpack.packb(cmd, use_bin_type=True)
        via_front, via_shard = _raw(front, body), _raw(ports[0], body)
        assert via_front["ok"] is False and via_front.get("error"), via_front
        assert via_shard == via_front, cmd
    for body in (b"\xc1", msgpack.packb([1, 2]), msgpack.packb({1: 2})):
        assert _raw(ports[0], body) == _raw(front, body)
    # What the port does not serve is refused, nothing applied, with the reqId echoed.
    for cmd in (
        {"cmd": "PULL", "queue": queue, "reqId": "a"},
        {"cmd": "PUSHB", "queue": queue, "jobs": [{"data": 1}], "reqId": "b"},
        {"cmd": "PUSH", "queue": queue, "data": 1, "parentId": "x", "reqId": "c"},
        {"cmd": "PUSH", "queue": _queue_on(1, "bad"), "data": 1, "reqId": "d"},
    ):
        reply = _raw(ports[0], msgpack.packb(cmd))
        assert reply["ok"] is False and reply["error"].startswith(DIRECT_REFUSED), reply
        assert reply["reqId"] == cmd["reqId"]
    # The bad PUSHes went to the engine, which refused them; nothing else did.
    assert _direct_requests(server) - before == sum(t.get("cmd") == "PUSH" for t in BAD_PUSHES)
    with TcpConnection(*server.tcp_address) as conn:
        assert conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"]["waiting"] == 0


def test_a_frame_over_the_limit_closes_the_direct_connection(shardq_server: Factory) -> None:
    server = shardq_server(shards=1, env={**DIRECT_ENV, "SHARDQ_MAX_FRAME_BYTES": "1024"})
    port = _hello(server)[HELLO_DIRECT][0]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">I", 4096) + b"x" * 100)
        reply = _read_frame(sock)
        assert reply["ok"] is False and reply["error"].startswith("Frame too large"), reply
        assert sock.recv(10) == b""  # then closed


def test_past_the_connection_cap_the_client_falls_back(shardq_server: Factory) -> None:
    env = {**DIRECT_ENV, "SHARDQ_DIRECT_MAX_CONNECTIONS": "1"}
    server = shardq_server(shards=1, env=env)
    port = _hello(server)[HELLO_DIRECT][0]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as holder:
        body = msgpack.packb({"cmd": "PUSH", "queue": "cap", "data": 1, "reqId": "h"})
        holder.sendall(struct.pack(">I", len(body)) + body)
        assert _read_frame(holder)["ok"] is True  # the one connection the cap allows
        with Connection(_url(server)) as conn:
            assert conn.call({"cmd": "PUSH", "queue": "cap", "data": 2})["ok"]
            assert conn.direct is not None and conn.direct.used == 0
            counts = conn.call({"cmd": "GetJobCounts", "queue": "cap"})["counts"]
            assert counts["waiting"] == 2


def _shard_listens(server: ShardqServer) -> dict[str, set[tuple[str, int]]]:
    return {
        name: listening(pid)
        for name, pid in server.child_pids().items()
        if name.startswith("shard")
    }


def test_on_by_default_on_the_configured_host_only(shardq_server: Factory) -> None:
    server = shardq_server(shards=2)  # no setting: the default
    ports = _hello(server)[HELLO_DIRECT]
    # Each shard listens on its announced port, on the TCP port's host, and nowhere else.
    assert _shard_listens(server) == {
        "shard-0": {("127.0.0.1", ports[0])},
        "shard-1": {("127.0.0.1", ports[1])},
    }
    with Connection(_url(server)) as conn:
        assert conn.call({"cmd": "PUSH", "queue": "plain", "data": 1})["ok"]
        assert conn.direct is not None and conn.direct.used == 1
    assert _direct_requests(server) == 1


def test_off_when_configured_off_and_the_client_goes_through_the_front_end(
    shardq_server: Factory,
) -> None:
    server = shardq_server(shards=2, env={"SHARDQ_DIRECT_SHARDS": "false"})
    with Connection(_url(server)) as conn:
        hello = conn.call({"cmd": "Hello", "protocolVersion": 3})
        assert HELLO_DIRECT not in hello and HELLO_SHARDS not in hello
        assert conn.call({"cmd": "PUSH", "queue": "plain", "data": 1})["ok"]
        assert conn.direct is not None and conn.direct.used == 0
        assert "directRequests" not in conn.call({"cmd": "Stats"})["stats"]
    assert _shard_listens(server) == {"shard-0": set(), "shard-1": set()}


def test_not_opened_with_auth_tokens(shardq_server: Factory) -> None:
    server = shardq_server(shards=1, env={**DIRECT_ENV, "AUTH_TOKENS": "secret"})
    with Connection(_url(server), token="secret") as conn:
        hello = conn.call({"cmd": "Hello", "protocolVersion": 3})
        assert HELLO_DIRECT not in hello
        assert conn.direct is None  # a client with a token never takes the direct path
    assert server.find_log("direct port not opened: auth_tokens or TLS are set") is not None
    # No port a client without the token could push through.
    assert _shard_listens(server) == {"shard-0": set()}


def test_not_opened_with_a_rate_limit(shardq_server: Factory) -> None:
    env = {**DIRECT_ENV, "SHARDQ_RATE_LIMIT_WINDOW_MS": "60000"}
    server = shardq_server(shards=1, env=env)
    with Connection(_url(server)) as conn:
        assert HELLO_DIRECT not in conn.call({"cmd": "Hello", "protocolVersion": 3})
        assert conn.call({"cmd": "PUSH", "queue": "limited", "data": 1})["ok"]
        assert conn.direct is not None and conn.direct.used == 0
    assert server.find_log("direct port not opened: a rate limit is set") is not None
    assert _shard_listens(server) == {"shard-0": set()}


def test_a_connection_closed_idle_is_opened_again_at_once(shardq_server: Factory) -> None:
    server = shardq_server(shards=1, env={**DIRECT_ENV, "SHARDQ_TCP_IDLE_CLOSE_MS": "200"})
    _hello(server)
    with Connection(_url(server)) as conn:
        assert conn.call({"cmd": "PUSH", "queue": "idle", "data": 1})["ok"]
        assert conn.direct is not None and conn.direct.used == 1
        server.wait_for_log("direct connection closed: idle", WAIT_S)
        # Not a restart: the shard's port still serves, so the push goes direct again.
        assert conn.call({"cmd": "PUSH", "queue": "idle", "data": 2})["ok"]
        assert conn.direct.used == 2
    assert _direct_requests(server) == 2


def test_a_port_that_cannot_be_reached_is_not_tried_again(direct_server: ShardqServer) -> None:
    server = direct_server
    before = _direct_requests(server)
    ports = _hello(server)[HELLO_DIRECT]
    dead = free_port()  # nothing listens there: a firewall or a proxy's view of the port
    queues = [_queue_on(0, "unreached"), _queue_on(1, "unreached")]
    with Connection(_url(server)) as conn:
        direct = conn.direct
        assert direct is not None
        assert conn.call({"cmd": "Ping"})["ok"]  # connected: its own Hello is behind it
        direct.learn({HELLO_SHARDS: 2, HELLO_DIRECT: [dead, ports[1]]})
        assert conn.call({"cmd": "PUSH", "queue": queues[0], "data": 1})["ok"]
        assert direct.used == 0  # through the front end, no error
        # A Hello naming the same port again: its shard's pushes go to the front end without
        # a new attempt (a failed one would make the whole path rest), the other shard's direct.
        direct.learn({HELLO_SHARDS: 2, HELLO_DIRECT: [dead, ports[1]]})
        for i in range(3):
            assert conn.call({"cmd": "PUSH", "queue": queues[0], "data": i})["ok"]
            assert conn.call({"cmd": "PUSH", "queue": queues[1], "data": i})["ok"]
        assert direct.used == 3
        # The port the server announces now is another: tried, and direct again.
        direct.learn({HELLO_SHARDS: 2, HELLO_DIRECT: ports})
        assert conn.call({"cmd": "PUSH", "queue": queues[0], "data": 9})["ok"]
        assert direct.used == 4
        counts = [conn.call({"cmd": "Count", "queue": q})["count"] for q in queues]
        assert counts == [5, 3]
    assert _direct_requests(server) - before == 4


@pytest.mark.parametrize(
    ("commands", "queue"),
    [
        ([{"cmd": "PUSH", "queue": "q", "data": 1}], "q"),
        ([{"cmd": "PUSH", "queue": "q", "parentId": "p"}], None),
        ([{"cmd": "PUSH", "queue": "q", "childrenIds": []}], None),
        ([{"cmd": "PUSH", "queue": 3}], None),
        ([{"cmd": "PUSHB", "queue": "q", "jobs": []}], None),
        ([{"cmd": "PUSH", "queue": "q"}, {"cmd": "PUSH", "queue": "q"}], None),
    ],
)
def test_which_commands_the_client_sends_direct(
    commands: list[dict[str, Any]], queue: str | None
) -> None:
    assert direct_queue(commands) == queue


def test_metrics_and_stats_count_the_direct_pushes(shardq_server: Factory) -> None:
    server = shardq_server(shards=2, env=DIRECT_ENV)
    _hello(server)
    queue = _queue_on(1, "counted")
    with Connection(_url(server)) as conn:
        for i in range(6):
            assert conn.call({"cmd": "PUSH", "queue": queue, "data": i})["ok"]
        pipelined = [{"cmd": "PUSH", "queue": queue, "data": i} for i in range(4)]
        assert all(r["ok"] for r in conn.call_many(pipelined))  # through the front end
        assert conn.direct is not None and conn.direct.used == 6
        assert conn.call({"cmd": "Metrics"})["metrics"]["totalPushed"] == 10
        stats = conn.call({"cmd": "Stats"})["stats"]
        assert stats["directPushed"] == 6 and "directPushPerSec" not in stats
        # 10 pushes over the default 5 s window, once their seconds have ended.
        window = 5

        def rate() -> float | None:
            got = float(conn.call({"cmd": "Stats"})["stats"]["pushPerSec"])
            return got if got == 10 / window else None

        poll_until(rate, WAIT_S, "pushPerSec to count both paths")
