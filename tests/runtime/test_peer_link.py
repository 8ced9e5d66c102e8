"""The forwarding link and forwarder (`shardq.runtime.frontend._forward`) against real
`shardq start` servers (nodes on SQLite, standing in for peers): a link pipelines over one
connection, refuses past its bounds with `Node busy` without sending, fails a frozen peer's
requests with `Node unavailable` after its timeout, reconnects after the peer is back, and
drops itself when a frozen peer's unsent bytes pass its bound; the
forwarder asks two peers for a job and sums their heartbeat counts; and `/ready`'s share
check reads the map a lease round writes.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from shardq_harness import ShardqServer

from shardq.client import TcpConnection
from shardq.cluster._map import NodeInfo, write_map
from shardq.runtime.frontend._flows import _Watching
from shardq.runtime.frontend._forward import (
    _RETRY_S,
    PEER,
    Forwarder,
    ForwardLimits,
    PeerLink,
    _relay,
)
from shardq.runtime.frontend._limits import ParkedSlots
from shardq.runtime.frontend._metrics import Counters, _Watched
from shardq.runtime.frontend._orphans import OrphanWatch
from shardq.runtime.frontend._replies import ParkedClient
from shardq.runtime.frontend._rewait import RewaitClient
from shardq.runtime.http._cluster_facts import share_check


async def _send(link: PeerLink, cmds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in cmds]
    for cmd, future in zip(cmds, futures, strict=True):
        link.send(cmd, future.set_result)
    async with asyncio.timeout(20):
        return list(await asyncio.gather(*futures))


def _signal_tree(server: ShardqServer, sig: int) -> None:
    for pid in [server.pid, *server.child_pids().values()]:
        os.kill(pid, sig)


def test_a_link_pipelines_bounds_times_out_and_reconnects(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server()
    address = f"127.0.0.1:{server.tcp_port}"

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        limits = ForwardLimits(node="peer-a", max_in_flight=4 + 2, timeout_s=0.5)
        link = PeerLink(address, loop, limits)
        pushes = [{"cmd": "PUSH", "queue": "fw", "data": {"i": i}} for i in range(4)]
        replies = await _send(link, pushes)
        assert [r["ok"] for r in replies] == [True] * 4
        assert all("reqId" not in r for r in replies)  # the link's ids stay on the link
        assert (await _send(link, [{"cmd": "Count", "queue": "fw"}]))[0]["count"] == 4
        assert link.in_flight == 0 and link.bytes == 0

        # Frozen: 6 fit (the Auth-less link's NoForward is long answered), the 7th is busy.
        _signal_tree(server, signal.SIGSTOP)
        try:
            started = time.monotonic()
            many = await _send(link, [{"cmd": "Count", "queue": "fw"}] * 7)
            waited = time.monotonic() - started
        finally:
            _signal_tree(server, signal.SIGCONT)
        errors = [r["error"] for r in many]
        busy = re.fullmatch(
            rf"Node busy: 6 requests \((\d+) bytes\) in flight to {address}", errors[6]
        )
        assert busy is not None and 6 * 20 < int(busy[1]) < 6 * 60, errors[6]  # ~33 bytes each
        assert all(
            e == f"Node unavailable: node {address} did not answer within 0.5 s" for e in errors[:6]
        ), errors
        assert 0.45 <= waited < 5
        assert link.in_flight == 0 and link.bytes == 0
        # Awake, the same link answers again.
        again = await _send(link, [{"cmd": "Count", "queue": "fw"}])
        assert again[0]["count"] == 4
        link.close()

        # A bound in bytes: a push larger than what is left waits for nothing.
        small = PeerLink(address, loop, ForwardLimits(node="peer-a", max_bytes=100))
        big = {"cmd": "PUSH", "queue": "fw", "data": {"blob": "x" * 200}}
        first, second = await _send(small, [big, big])
        assert first["ok"] is True
        assert second["error"].startswith("Node busy: 1 requests (2"), second
        small.close()

    asyncio.run(scenario())


def test_a_peer_that_stops_reading_cannot_grow_the_unsent_buffer_past_the_bound(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server()
    address = f"127.0.0.1:{server.tcp_port}"
    big = {"cmd": "PUSH", "queue": "fw", "data": {"blob": "x" * 150_000}}

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        link = PeerLink(address, loop, ForwardLimits(node="a", max_bytes=200_000, timeout_s=0.2))
        assert (await _send(link, [{"cmd": "Ping"}]))[0]["ok"] is True  # connected
        errors: list[str] = []
        _signal_tree(server, signal.SIGSTOP)
        try:
            # Each round's pushes time out (the peer is frozen) and free the in-flight
            # bound; their bytes pile up unsent until the link gives up on the peer.
            for _ in range(40):
                errors += [r.get("error", "") for r in await _send(link, [big, big])]
                if any("is not reading" in e for e in errors):
                    break
        finally:
            _signal_tree(server, signal.SIGCONT)
        assert link.bytes == 0 and link.in_flight == 0
        await asyncio.sleep(1.1)  # a dropped link is not opened again for a second
        again = await _send(link, [{"cmd": "Ping"}])  # a new connection, the peer awake
        assert again[0]["ok"] is True, again
        link.close()
        return errors

    errors = asyncio.run(scenario())
    dropped = [e for e in errors if "is not reading" in e]
    assert dropped and dropped[0].startswith(f"Node unavailable: node {address} is not reading (")
    assert all(e.startswith(("Node unavailable", "Node busy")) for e in errors), set(errors)


def test_an_unreachable_peer_answers_at_once_and_is_retried_after_a_second() -> None:
    """Connection attempts are counted, not timed: a forward sent inside the backoff is
    answered without one, and the next attempt starts at least `_RETRY_S` after the last one
    failed (a loaded machine only makes that gap longer). At least two attempts are seen."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        attempts: list[tuple[float, float]] = []  # (started, failed), loop time
        connect = loop.create_connection

        async def counted(*args: Any, **kwargs: Any) -> Any:
            started = loop.time()
            try:
                return await connect(*args, **kwargs)
            finally:
                attempts.append((started, loop.time()))

        loop.create_connection = counted  # type: ignore[method-assign]
        link = PeerLink("127.0.0.1:9", loop, ForwardLimits(node="peer-a"))  # discard: closed
        replies: list[dict[str, Any]] = []
        without_attempt = 0
        deadline = loop.time() + 20 * _RETRY_S
        while len(attempts) < 2 and loop.time() < deadline:  # bounded: about 400 sends
            before = len(attempts)
            replies += await _send(link, [{"cmd": "Ping"}])
            without_attempt += len(attempts) == before
            await asyncio.sleep(_RETRY_S / 20)
        link.close()
        assert len(attempts) == 2, attempts  # retried once the backoff had passed
        assert without_attempt >= 1, "every forward tried a new connection"
        assert attempts[1][0] - attempts[0][1] >= _RETRY_S, attempts  # none inside it
        for reply in replies:
            assert reply["error"].startswith(
                "Node unavailable: node 127.0.0.1:9 cannot be reached (ConnectionRefusedError"
            ), reply

    asyncio.run(scenario())


def test_ready_share_check_reads_the_lease_rounds_map(tmp_path: Path) -> None:
    assert share_check(str(tmp_path)) == (
        False,
        {"reason": "no lease round yet: this node holds no partitions"},
    )
    nodes = [NodeInfo("a", "h:1", True, 6), NodeInfo("b", "h:2", True, 10),
             NodeInfo("c", "h:3", False, 0)]  # fmt: skip

    def publish(held: int, valid_for: float) -> tuple[bool, dict[str, Any]]:
        write_map(str(tmp_path), node="a", address="h:1", partitions=16,
                  valid_until=time.monotonic() + valid_for, held=list(range(held)),
                  nodes=nodes, owners={})  # fmt: skip
        return share_check(str(tmp_path))

    ready, facts = publish(8, 5.0)
    assert ready and facts == {"cluster": {"held": 8, "share": 8, "liveNodes": 2}}
    ready, facts = publish(6, 5.0)
    assert not ready and facts["reason"] == "this node's partition leases are fewer than its share"
    ready, facts = publish(8, -1.0)
    assert not ready and facts["cluster"]["held"] == 0
    assert facts["reason"] == "this node's partition leases are not renewed"


class _Client:
    """The dispatcher's view of a client connection (what `Forwarder` reads of it)."""

    conn = "c1"
    authenticated = True

    def __init__(self, no_forward: int = 0) -> None:
        self.no_forward = no_forward

    def send(self, reply: dict[str, Any]) -> None:
        raise AssertionError("the forwarder answers through `done` here")

    def drop(self, reason: str) -> None:
        raise AssertionError(reason)


def test_a_forwarder_asks_every_peer_for_a_job_and_sums_their_heartbeats(
    shardq_server: Callable[..., ShardqServer], tmp_path: Path
) -> None:
    """Three nodes' worth of fan-out: this one (no server needed) and two real peers, the job
    on the second; a peer's own request is never fanned out again."""
    first, second = (shardq_server(data_dir=tmp_path / name) for name in ("p1", "p2"))
    peers = [f"127.0.0.1:{first.tcp_port}", f"127.0.0.1:{second.tcp_port}"]
    # Open while the peers are asked: a TCP connection's close releases the jobs it pulled.
    worker = TcpConnection(*second.tcp_address, timeout=15)
    worker.call({"cmd": "PUSHB", "queue": "fo", "jobs": [{"data": {}}, {"data": {}}]})
    ids = [j["id"] for j in worker.call({"cmd": "PULLB", "queue": "fo", "count": 2})["jobs"]]

    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        forwarder = Forwarder(loop, ForwardLimits(node="me"), lambda: peers)
        local = {"ok": False, "error": "Job not found"}
        results: list[Any] = []
        for cmd, name in (({"id": ids[0]}, "GetJob"), ({"id": "nowhere"}, "GetJob")):
            done = loop.create_future()
            assert forwarder.fan_out(_Client(), name, cmd, dict(local), done.set_result)
            results.append(await done)
        done = loop.create_future()
        counts = {"ids": [*ids, "nowhere"]}
        assert forwarder.fan_out_counts(_Client(), "JobHeartbeatB", counts, done.set_result)
        results.append(await done)
        assert not forwarder.fan_out(_Client(PEER), "GetJob", {"id": ids[0]}, local, print)
        assert not forwarder.fan_out_counts(_Client(PEER), "ExtendLocks", counts, print)
        results.append(forwarder.forwards)
        forwarder.close()
        return results

    try:
        found, missing, beat, forwards = asyncio.run(scenario())
    finally:
        worker.close()
    assert found["ok"] is True and found["job"]["id"] == ids[0]
    assert missing == {"ok": False, "error": "Job not found"}  # every peer said so: ours
    assert beat == {"ok": True, "data": {"ok": True, "count": 2}}
    assert forwards == 3


class _Recorder(_Client):
    """A client connection that keeps what it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.replies: list[dict[str, Any]] = []

    def send(self, reply: dict[str, Any]) -> None:
        self.replies.append(reply)


def test_a_moved_answer_from_the_holder_reaches_the_client_as_partition_unavailable() -> None:
    # The two nodes' maps disagree for a moment while a partition changes hands: the holder
    # by this node's map answers MOVED, which a client that did not ask for MOVED must not
    # see; it gets the guard's retryable refusal instead. Other answers pass unchanged.
    client = _Recorder()
    _relay(client, "7", "10.0.0.2:6789", {"ok": False, "error": "MOVED 9 10.0.0.3:6789"})
    _relay(client, "8", "10.0.0.2:6789", {"ok": True, "id": "j1"})
    moved, ok = client.replies
    assert moved["reqId"] == "7" and moved["ok"] is False
    assert moved["error"].startswith("Partition unavailable: node 10.0.0.2:6789 ")
    assert "partition 9" in moved["error"] and moved["error"].endswith("retry")
    assert ok == {"ok": True, "id": "j1", "reqId": "8"}


def test_every_stand_in_client_says_what_its_connection_asked_with_no_forward() -> None:
    """A command on its way is answered through a stand-in for its connection (counting its
    reply, freeing a parked slot, watching a flow's parents, routing a wait again). Each must
    carry the connection's `NoForward`: one that did not made a peer's request look like a
    client's, so it was forwarded or fanned out again, back and forth between two nodes."""
    peer = _Client(no_forward=PEER)
    loop = asyncio.new_event_loop()
    try:
        stand_ins = [
            ParkedClient(ParkedSlots(1, 1), peer),
            _Watched(Counters(), peer, "ACK", 1),
            _Watching(peer, cast(OrphanWatch, None), "PUSH", {"queue": "q"}, [0]),
            RewaitClient(peer, lambda *_: None, loop, None, {"id": "j"}, 1.0),
        ]
    finally:
        loop.close()
    for stand_in in stand_ins:
        assert (stand_in.no_forward, stand_in.conn, stand_in.authenticated) == (PEER, "c1", True)
        stand_in.authenticated = False
        assert peer.authenticated is False
        peer.authenticated = True
