"""A shard's direct connections end cleanly when it stops (issues 22 and 24).

A stopping shard stops reading its direct port at a frame boundary, answers every push it took
(a durable one after its commit), then ends each connection with a goodbye frame and FIN. A
push that had no reply by then was never taken: shardq's client sends it through the front end,
so no push is lost or applied twice, and no caller is left not knowing whether its push was
applied (while a restarted shard is down, the front end answers `Shard unavailable`: not
applied either).

Real servers; the shard is stopped by SIGTERM and its supervisor starts it again. What a push
answered ok is, and that nothing is there twice, is read back from the restarted server (which
loads the queue from storage).
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import msgpack  # type: ignore[import-untyped]
from shardq_harness import ShardqServer, poll_until
from test_direct_path import DIRECT_ENV, WAIT_S, _hello, _queue_on, _url

from shardq.client import ConnectionLost, TcpConnection
from shardq.client._async_connection import AsyncConnection
from shardq.client._async_transport import AsyncTcpTransport, wait_replies_async
from shardq.client._connection import Connection
from shardq.client._sync_transport import SyncTcpTransport, wait_replies
from shardq.client._url import ClientSecurity, parse_url
from shardq.protocol._direct import DIRECT_CLOSING, HELLO_DIRECT

Factory = Callable[..., ShardqServer]
# The front end's answer for a shard that is down (between its exit and its restart): the push
# was not applied.
UNAVAILABLE = "Shard unavailable"


def _frame(msg: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(msg, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def _frames(buffer: bytearray) -> Iterator[dict[str, Any]]:
    """Cut the whole frames off the front of `buffer`."""
    while len(buffer) >= 4 and len(buffer) >= 4 + struct.unpack(">I", buffer[:4])[0]:
        size = struct.unpack(">I", buffer[:4])[0]
        frame: dict[str, Any] = msgpack.unpackb(bytes(buffer[4 : 4 + size]), raw=False)
        del buffer[: 4 + size]
        yield frame


def _drain(server: ShardqServer, queue: str) -> list[Any]:
    """Every job's data in `queue`, pulled (and acked) through the front end."""
    host, port = server.tcp_address
    data: list[Any] = []
    with TcpConnection(host, port) as conn:
        while True:
            jobs = conn.call({"cmd": "PULLB", "queue": queue, "count": 1000})["jobs"]
            if not jobs:
                return data
            data += [job["data"] for job in jobs]
            assert conn.call({"cmd": "ACKB", "ids": [job["id"] for job in jobs]})["ok"]


def _ended(server: ShardqServer) -> list[dict[str, Any]]:
    return [line for line in server.logs() if line.get("event") == "direct connections ended"]


class _Raw:
    """One raw connection to a direct port that keeps pushing until the shard ends it."""

    def __init__(self, port: int, queue: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setblocking(False)
        self.queue = queue
        self.sent: list[str] = []
        self.replies: dict[str, dict[str, Any]] = {}
        self.after: list[dict[str, Any]] = []  # frames after the goodbye (none expected)
        self.goodbye = False
        self.eof = False
        self._buffer = bytearray()

    def push(self, count: int) -> None:
        out = b""
        for _ in range(count):
            rid = str(len(self.sent))
            self.sent.append(rid)
            out += _frame({"cmd": "PUSH", "queue": self.queue, "data": rid, "durable": True,
                           "reqId": rid})  # fmt: skip
        try:
            self.sock.sendall(out)
        except (BlockingIOError, OSError):
            del self.sent[-count:]  # not written whole (the shard is gone): not counted

    def read(self, timeout: float) -> None:
        if not select.select([self.sock], [], [], timeout)[0]:
            return
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return
        self._buffer += data
        for frame in _frames(self._buffer):
            if self.goodbye:
                self.after.append(frame)
            elif frame.get("type") == DIRECT_CLOSING:
                self.goodbye = True
            else:
                self.replies[str(frame["reqId"])] = frame


def test_a_stopping_shard_answers_what_it_took_then_says_goodbye(shardq_server: Factory) -> None:
    server = shardq_server(shards=2, env=DIRECT_ENV)
    port = _hello(server)[HELLO_DIRECT][0]
    queue = _queue_on(0, "raw-stop")
    raw, partial = _Raw(port, queue), _Raw(port, queue)
    raw.push(200)
    # Half a frame, read by the shard before the signal: dropped at the stop, never applied.
    frame = _frame({"cmd": "PUSH", "queue": queue, "data": "partial", "reqId": "partial"})
    partial.sock.sendall(frame[: len(frame) // 2])
    time.sleep(0.2)
    old = server.child_pids()["shard-0"]
    os.kill(old, signal.SIGTERM)
    deadline = time.monotonic() + WAIT_S
    while not (raw.eof and partial.eof) and time.monotonic() < deadline:
        if not raw.goodbye and not raw.eof:
            raw.push(1)  # pushes keep coming while the shard stops
        raw.read(0.001)
        partial.read(0.001)
    for conn in (raw, partial):
        conn.sock.close()
        assert conn.goodbye and conn.eof, (conn.goodbye, conn.eof)
        assert conn.after == []  # the goodbye is the last frame
    assert partial.replies == {}
    assert all(reply["ok"] for reply in raw.replies.values()), raw.replies
    answered = set(raw.replies)
    assert len(answered) >= 200  # the burst came before the signal: taken, so answered
    server.wait_child_replaced("shard-0", old, WAIT_S)
    # Answered: committed; not answered: not applied (none half-applied, none lost).
    assert sorted(_drain(server, queue)) == sorted(answered)
    assert _ended(server)[0]["released"] == 2
    assert server.stop() == 0, server.log_tail()


def test_a_goodbye_left_unread_still_tells_the_client_nothing_was_taken(
    shardq_server: Factory,
) -> None:
    """The client writes twice to a connection whose goodbye it has not read yet: the shard
    is gone, so the first write draws a reset and the second fails. What is left to read
    still decides: not sent."""
    server = shardq_server(shards=2, env=DIRECT_ENV)
    port = _hello(server)[HELLO_DIRECT][0]
    queue = _queue_on(0, "unread-goodbye")
    endpoint = parse_url(f"tcp://127.0.0.1:{port}")
    transport = SyncTcpTransport(endpoint, 5.0, ClientSecurity())
    push = {"cmd": "PUSH", "queue": queue, "data": "x"}
    assert wait_replies(transport, [push], 10)[0]["ok"]
    old = server.child_pids()["shard-0"]
    os.kill(old, signal.SIGTERM)
    server.wait_child_replaced("shard-0", old, WAIT_S)  # the goodbye waits, unread
    _, first = transport.request([push])  # written; the closed socket answers with a reset
    time.sleep(0.2)
    try:
        wait_replies(transport, [push], 10)  # this write fails: the peer reset
        raise AssertionError("a push on a connection the shard ended was answered")
    except ConnectionLost as e:
        assert not e.sent, e
    error = first[0].exception()
    assert isinstance(error, ConnectionLost) and not error.sent, error
    assert transport.ended
    assert _drain(server, queue) == ["x"]


def test_asyncio_a_goodbye_left_unread_still_tells_the_client_nothing_was_taken(
    shardq_server: Factory,
) -> None:
    """The same for asyncio, whose transport drops what is left to read when a write fails:
    the loop is blocked while the shard stops, so that two writes go out before it reads."""
    server = shardq_server(shards=2, env=DIRECT_ENV)
    port = _hello(server)[HELLO_DIRECT][0]
    queue = _queue_on(0, "aio-unread-goodbye")
    push = {"cmd": "PUSH", "queue": queue, "data": "x"}

    async def run() -> list[BaseException | None]:
        endpoint = parse_url(f"tcp://127.0.0.1:{port}")
        transport = await AsyncTcpTransport.open(endpoint, 5.0, ClientSecurity())
        assert (await wait_replies_async(transport, [push], 10))[0]["ok"]
        old = server.child_pids()["shard-0"]
        os.kill(old, signal.SIGTERM)
        server.wait_child_replaced("shard-0", old, WAIT_S)  # blocks the loop: unread
        futures = []
        for _ in range(2):
            futures += transport.submit([push], 10)[1]
            transport._flush()  # written at once, as the loop would at its next turn
            time.sleep(0.2)  # the first write draws a reset, the second fails
        errors = [await asyncio.wait_for(_error(f), 10) for f in futures]
        assert transport.ended
        return errors

    for error in asyncio.run(run()):
        assert isinstance(error, ConnectionLost) and not error.sent, error
    assert _drain(server, queue) == ["x"]


async def _error(future: asyncio.Future[Any]) -> BaseException | None:
    try:
        await future
    except BaseException as e:
        return e
    return None


class _Outcomes:
    """What each push got: its data if answered ok, the error otherwise (thread-safe)."""

    def __init__(self) -> None:
        self.ok: list[str] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def record(self, data: str, error: BaseException | None) -> None:
        with self._lock:
            if error is None:
                self.ok.append(data)
            else:
                self.errors.append(f"{type(error).__name__}: {error}")

    def check(self, server: ShardqServer, queue: str) -> None:
        """Refused only by the front end while the shard was down (not applied), never an
        unknown fate; every push answered ok is there, once."""
        assert all(UNAVAILABLE in error for error in self.errors), self.errors
        stored = _drain(server, queue)
        assert not [d for d, n in Counter(stored).items() if n > 1], "a push applied twice"
        assert sorted(stored) == sorted(self.ok)


def test_sync_pushes_run_across_a_sigterm_restart(shardq_server: Factory) -> None:
    server = shardq_server(shards=2, env=DIRECT_ENV)
    _hello(server)
    queue = _queue_on(0, "sync-stop")
    shared, own = Connection(_url(server)), Connection(_url(server))
    outcomes = _Outcomes()
    stop = threading.Event()

    def pusher(conn: Connection, name: str) -> None:
        i = 0
        while not stop.is_set():
            data = f"{name}-{i}"
            command = {"cmd": "PUSH", "queue": queue, "data": data, "durable": i % 2 == 0}
            try:
                conn.call(command)
                outcomes.record(data, None)
            except Exception as e:
                outcomes.record(data, e)
            i += 1
            time.sleep(0.001)

    threads = [
        threading.Thread(target=pusher, args=(conn, name), daemon=True)
        for conn, name in ((shared, "a"), (shared, "b"), (own, "c"))
    ]
    try:
        for t in threads:
            t.start()
        poll_until(lambda: shared.direct and own.direct and min(  # type: ignore[union-attr]
            shared.direct.used, own.direct.used) > 20, WAIT_S, "pushes going direct")  # fmt: skip
        old = server.child_pids()["shard-0"]
        os.kill(old, signal.SIGTERM)
        server.wait_child_replaced("shard-0", old, WAIT_S)
        after = len(outcomes.ok)
        poll_until(lambda: len(outcomes.ok) > after + 50, WAIT_S, "pushes after the restart")
    finally:
        stop.set()
        for t in threads:
            t.join(WAIT_S)
        shared.close()
        own.close()
    assert _ended(server)[0]["released"] == 2  # both connections got their goodbye
    outcomes.check(server, queue)
    assert server.stop() == 0, server.log_tail()


def test_asyncio_pushes_run_across_a_sigterm_restart(shardq_server: Factory) -> None:
    server = shardq_server(shards=2, env=DIRECT_ENV)
    _hello(server)
    queue = _queue_on(1, "aio-stop")
    outcomes = _Outcomes()

    async def pusher(conn: AsyncConnection, name: str, stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            data = f"{name}-{i}"
            command = {"cmd": "PUSH", "queue": queue, "data": data, "durable": i % 2 == 1}
            try:
                await conn.call(command)
                outcomes.record(data, None)
            except Exception as e:
                outcomes.record(data, e)
            i += 1
            await asyncio.sleep(0.001)

    async def run() -> None:
        stop = asyncio.Event()
        async with AsyncConnection(_url(server)) as conn:
            tasks = [asyncio.create_task(pusher(conn, name, stop)) for name in "abc"]
            try:
                while conn.direct is None or conn.direct.used < 50:
                    await asyncio.sleep(0.01)
                old = server.child_pids()["shard-1"]
                os.kill(old, signal.SIGTERM)
                await asyncio.to_thread(server.wait_child_replaced, "shard-1", old, WAIT_S)
                after = len(outcomes.ok)
                deadline = time.monotonic() + WAIT_S
                while len(outcomes.ok) <= after + 50 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
        assert len(outcomes.ok) > after + 50, "pushes stopped after the restart"

    asyncio.run(asyncio.wait_for(run(), 2 * WAIT_S))
    assert _ended(server)[0]["released"] == 1
    outcomes.check(server, queue)
    assert server.stop() == 0, server.log_tail()
