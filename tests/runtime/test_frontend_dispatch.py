"""The front end's Dispatcher against real in-process ShardCores (no sockets, no processes).

Covers the routing paths a process test cannot reach on purpose: job-cache misses (a job the
front end never saw a reply for), split batches and their recombination.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from shardq.core import Engine
from shardq.errors import ProtocolError
from shardq.runtime._routing import shard_of
from shardq.runtime.frontend._dispatch import Dispatcher
from shardq.runtime.links._control import pack, unpack
from shardq.runtime.shard._core import ShardCore

T0 = 1_700_000_000_000
N = 2
QA = "qa"  # shard 0
QB = next(f"q{i}" for i in range(100) if shard_of(f"q{i}", N) != shard_of(QA, N))
assert shard_of(QA, N) == 0


class FakeClient:
    def __init__(self, conn: str = "t1", authenticated: bool = True) -> None:
        self.conn = conn
        self.authenticated = authenticated
        self.sent: list[dict[str, Any]] = []
        self.dropped: list[str] = []

    def send(self, reply: dict[str, Any]) -> None:
        self.sent.append(reply)

    def drop(self, reason: str) -> None:
        self.dropped.append(reason)


class Harness:
    """A dispatcher whose shards are ShardCores in this process; the writer commits at once."""

    def __init__(self, tokens: tuple[str, ...] = ()) -> None:
        self.loop = asyncio.new_event_loop()
        self.cores = [ShardCore(i, Engine(seed=i)) for i in range(N)]
        self.dispatcher = Dispatcher(N, self._to_shard, self.loop, tokens)
        self.client = FakeClient(authenticated=not tokens)
        self.reqs = 0

    def _to_shard(self, shard: int, data: bytes) -> None:
        core = self.cores[shard]
        core.handle(unpack(data), T0)
        self._end_turn(core)

    def _end_turn(self, core: ShardCore) -> None:
        for dest, msg in core.finish_turn(T0):
            if dest == "writer":
                self.loop.call_soon(self._commit, core, msg["seq"])
            else:
                # Through msgpack, as on the wire, and on a later loop turn.
                self.loop.call_soon(self.dispatcher.on_shard_message, unpack(pack(msg)))

    def _commit(self, core: ShardCore, seq: int) -> None:
        core.handle({"t": "done", "seq": seq}, T0)
        self._end_turn(core)

    def settle(self) -> None:
        for _ in range(20):
            self.loop.run_until_complete(asyncio.sleep(0))

    def call(self, cmd: dict[str, Any], client: FakeClient | None = None) -> dict[str, Any]:
        client = client or self.client
        self.reqs += 1
        req = str(self.reqs)
        self.dispatcher.handle(client, {**cmd, "reqId": req})
        self.settle()
        replies = [r for r in client.sent if r.get("reqId") == req]
        assert len(replies) == 1, replies
        reply = replies[0]
        del reply["reqId"]
        return reply

    def direct(self, shard: int, cmd: dict[str, Any]) -> dict[str, Any]:
        """Run a command on one shard behind the front end's back (its cache learns nothing)."""
        core = self.cores[shard]
        core.handle({"t": "req", "items": [["x", 1, cmd]]}, T0)
        out = core.finish_turn(T0)
        reps = [m for d, m in out if d == "front" and m["t"] == "rep"]
        return dict(reps[0]["items"][0][2])

    def close(self) -> None:
        self.loop.close()


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def pulled_pair(h: Harness) -> list[tuple[str, str]]:
    """One leased job on each shard, pulled behind the front end's back."""
    out = []
    for shard, queue in ((0, QA), (1, QB)):
        h.direct(shard, {"cmd": "PUSH", "queue": queue, "data": shard})
        reply = h.direct(shard, {"cmd": "PULL", "queue": queue, "owner": "w"})
        out.append((reply["job"]["id"], reply["token"]))
    return out


def test_queue_commands_go_to_their_shard(h: Harness) -> None:
    a = h.call({"cmd": "PUSH", "queue": QA, "data": 1})["id"]
    b = h.call({"cmd": "PUSH", "queue": QB, "data": 2})["id"]
    assert h.cores[0].engine.find(a) is not None and h.cores[1].engine.find(b) is not None
    assert h.dispatcher.cache.get(a) == 0 and h.dispatcher.cache.get(b) == 1
    assert h.call({"cmd": "GetJob", "id": b})["job"]["data"] == 2


def test_id_command_on_a_cache_miss_asks_every_shard(h: Harness) -> None:
    job_id = h.direct(1, {"cmd": "PUSH", "queue": QB, "data": 5})["id"]
    assert h.dispatcher.cache.get(job_id) is None
    assert h.call({"cmd": "GetJob", "id": job_id})["job"]["data"] == 5
    assert h.dispatcher.cache.get(job_id) == 1
    assert h.call({"cmd": "GetJob", "id": "missing"}) == {"ok": False, "error": "Job not found"}
    assert h.dispatcher.pending == 0


def test_queries_that_answer_ok_for_unknown_ids_pick_the_owner(h: Harness) -> None:
    job_id = h.direct(1, {"cmd": "PUSH", "queue": QB, "data": 5})["id"]
    assert h.call({"cmd": "GetState", "id": job_id})["state"] == "waiting"
    unknown = h.call({"cmd": "GetState", "id": "nope"})
    assert unknown == {"ok": True, "id": "nope", "state": "unknown"}


def test_ack_on_a_cache_miss(h: Harness) -> None:
    (_, _), (b, token) = pulled_pair(h)
    assert h.call({"cmd": "ACK", "id": b, "token": "wrong"})["error"].startswith("Invalid")
    assert h.call({"cmd": "ACK", "id": b, "token": token}) == {"ok": True}
    assert h.call({"cmd": "GetState", "id": b})["state"] == "completed"


def test_ackb_split_across_shards_with_misses(h: Harness) -> None:
    (a, ta), (b, tb) = pulled_pair(h)
    reply = h.call({"cmd": "ACKB", "ids": [a, b], "tokens": [ta, tb], "results": [1, 2]})
    assert reply == {"ok": True}
    assert h.cores[0].engine.find(a).result == 1  # type: ignore[union-attr]
    assert h.cores[1].engine.find(b).result == 2  # type: ignore[union-attr]


def test_ackb_split_by_cache(h: Harness) -> None:
    ids = []
    for queue in (QA, QB):
        h.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": i} for i in range(3)]})
        pulled = h.call({"cmd": "PULLB", "queue": queue, "count": 3, "owner": "w"})
        ids += [(j["id"], t) for j, t in zip(pulled["jobs"], pulled["tokens"], strict=True)]
    reply = h.call({"cmd": "ACKB", "ids": [i for i, _ in ids], "tokens": [t for _, t in ids]})
    assert reply == {"ok": True}
    assert h.call({"cmd": "Stats"})["stats"]["completed"] == 6


def test_ackb_reports_an_error_of_one_part(h: Harness) -> None:
    (a, ta), (b, _tb) = pulled_pair(h)
    reply = h.call({"cmd": "ACKB", "ids": [a, b], "tokens": [ta, "bad"]})
    assert reply == {"ok": False, "error": f"Invalid or expired lock token for job {b}"}
    # Leases are checked per shard: the other shard's part was applied.
    assert h.call({"cmd": "GetState", "id": a})["state"] == "completed"


def test_ackb_misaligned_gets_the_engine_error(h: Harness) -> None:
    reply = h.call({"cmd": "ACKB", "ids": ["a", "b"], "tokens": ["x"]})
    assert reply == {"ok": False, "error": "ACKB tokens length must match ids length"}


def test_heartbeat_batches_count_each_job_once(h: Harness) -> None:
    (a, ta), (b, tb) = pulled_pair(h)
    reply = h.call({"cmd": "JobHeartbeatB", "ids": [a, b, "x"], "tokens": [ta, tb, "y"]})
    assert reply == {"ok": True, "data": {"ok": True, "count": 2}}
    reply = h.call(
        {"cmd": "ExtendLocks", "ids": [a, b], "tokens": [ta, tb], "durations": [5000, 5000]}
    )
    assert reply == {"ok": True, "count": 2}


def test_wait_job_waits_for_the_owning_shard(h: Harness) -> None:
    (_, _), (b, tb) = pulled_pair(h)
    h.dispatcher.handle(h.client, {"cmd": "WaitJob", "id": b, "timeout": 5000, "reqId": "w"})
    h.settle()
    assert not [r for r in h.client.sent if r.get("reqId") == "w"]  # shard 0's "not found" waits
    h.call({"cmd": "ACK", "id": b, "token": tb, "result": "r"})
    assert {"ok": True, "completed": True, "result": "r", "reqId": "w"} in h.client.sent


def test_fan_out_merges(h: Harness) -> None:
    h.call({"cmd": "PUSH", "queue": QB, "data": 1})
    h.call({"cmd": "PUSH", "queue": QA, "data": 1, "delay": 1000})
    assert h.call({"cmd": "ListQueues"}) == {"ok": True, "queues": sorted([QA, QB])}
    stats = h.call({"cmd": "Stats"})["stats"]
    assert (stats["waiting"], stats["delayed"]) == (1, 1)
    # Two pushes over the default 5 s window: 0 until their second is over, then 2 / 5.
    assert stats["pushPerSec"] in (0, 0.2, 0.4)


def test_front_end_answers_and_command_names(h: Harness) -> None:
    hello = h.call({"cmd": "Hello", "protocolVersion": 2})
    assert (hello["protocolVersion"], hello["capabilities"], hello["server"]) == (
        2,
        ["pipelining"],
        "bunqueue",
    )
    assert h.call({"cmd": "Hello"})["capabilities"] == ["pipelining", "separate-job-name"]
    assert h.call({"cmd": "Ping"})["data"]["pong"] is True
    assert h.call({"cmd": "Auth", "token": "x"}) == {"ok": False, "error": "Invalid token"}
    assert h.call({"cmd": "Foo"}) == {"ok": False, "error": "Unknown command: Foo"}
    # Served by the front end (docs/protocol.md §18): a subscription names a valid queue.
    assert h.call({"cmd": "SubscribeEvents"})["error"] == "Queue name is required"


def test_transport_errors(h: Harness) -> None:
    client = FakeClient()
    h.dispatcher.handle(client, ProtocolError("Invalid command format"))
    h.dispatcher.handle(client, {"reqId": "1"})
    h.dispatcher.handle(client, {"reqId": 2})
    h.dispatcher.handle(client, ProtocolError("Frame too large: 9 bytes", fatal=True))
    assert client.sent == [
        {"ok": False, "error": "Invalid command format"},
        {"ok": False, "error": "Invalid command", "reqId": "1"},
        {"ok": False, "error": "Invalid command"},
        {"ok": False, "error": "Frame too large: 9 bytes"},
    ]
    assert client.dropped == ["Frame too large: 9 bytes"]


def test_request_ids_are_echoed_verbatim(h: Harness) -> None:
    client = FakeClient()
    h.dispatcher.handle(client, {"cmd": "PUSH", "queue": QA, "data": 1, "reqId": 7})
    h.dispatcher.handle(client, {"cmd": "Ping"})
    h.settle()
    (push,) = [r for r in client.sent if "id" in r]
    (ping,) = [r for r in client.sent if "data" in r]
    assert push["reqId"] == 7 and "reqId" not in ping


def test_auth_gate() -> None:
    h = Harness(tokens=("s1", "s2"))
    try:
        assert h.call({"cmd": "Ping"}) == {"ok": False, "error": "Not authenticated"}
        assert h.call({"cmd": "Auth", "token": "nope"}) == {"ok": False, "error": "Invalid token"}
        assert h.call({"cmd": "Auth", "token": 5}) == {"ok": False, "error": "Invalid token"}
        assert h.call({"cmd": "Auth", "token": "s2"}) == {"ok": True}
        assert h.call({"cmd": "Ping"})["ok"] is True
        other = FakeClient(conn="t2", authenticated=False)
        assert h.call({"cmd": "Stats"}, other)["error"] == "Not authenticated"
    finally:
        h.close()


def test_close_is_sent_after_the_turns_requests(h: Harness) -> None:
    h.call({"cmd": "PUSH", "queue": QB, "data": 1})
    h.dispatcher.handle(h.client, {"cmd": "PULL", "queue": QB, "owner": "w", "reqId": "p"})
    h.dispatcher.connection_closed(h.client.conn)
    h.settle()
    # The pull was applied first, then released by the close: the job is waiting again.
    assert h.call({"cmd": "Count", "queue": QB}) == {"ok": True, "count": 1}


def test_a_front_end_bug_answers_internal_error(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(h.dispatcher, "_route", broken)
    assert h.call({"cmd": "Count", "queue": QA}) == {"ok": False, "error": "Internal server error"}
    assert h.call({"cmd": "Ping"})["ok"]
