"""The front end's `Router` on its own: what leaves for each shard, in which order, and who
gets each reply. The dispatcher's tests (test_frontend_dispatch.py) cover routing by queue and
by job id against real shard cores; these pin the outbox and control ordering the command
tables (cron, flows, webhooks, events) rely on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from shardq.runtime.frontend._merge import JobCache
from shardq.runtime.frontend._router import Router
from shardq.runtime.links._control import unpack


class Wire:
    """What the router sent, decoded, per shard, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, dict[str, Any]]] = []

    def send(self, shard: int, data: bytes) -> None:
        self.sent.append((shard, unpack(data)))


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _turn(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0))


def test_a_turn_leaves_as_one_batch_then_its_control_messages(
    loop: asyncio.AbstractEventLoop,
) -> None:
    wire = Wire()
    router = Router(2, wire.send, loop, JobCache())
    replies: list[tuple[str, dict[str, Any]]] = []
    router.ask(1, "c1", {"cmd": "PUSH", "queue": "a"}, lambda r: replies.append(("a", r)))
    router.control(1, {"t": "close", "conn": "c0"})
    router.ask(1, "c1", {"cmd": "PUSH", "queue": "b"}, lambda r: replies.append(("b", r)))
    router.control_now(1, {"t": "listen", "conn": "c1"})
    assert wire.sent == [(1, {"t": "listen", "conn": "c1"})]  # at once, ahead of the batch
    assert router.pending == 2 and router.pending_per_shard() == [0, 2]
    _turn(loop)
    assert [msg["t"] for _, msg in wire.sent] == ["listen", "req", "close"]
    batch = wire.sent[1][1]["items"]
    assert [(conn, cmd["queue"]) for conn, _rid, cmd in batch] == [("c1", "a"), ("c1", "b")]
    # Replies go to their own callbacks whatever their order; an unknown rid is dropped.
    (_, rid_a, _), (_, rid_b, _) = batch
    router.deliver([["c1", rid_b, {"ok": True, "n": 2}], ["c1", 999, {"ok": True}]])
    router.deliver([["c1", rid_a, {"ok": True, "n": 1}]])
    assert replies == [("b", {"ok": True, "n": 2}), ("a", {"ok": True, "n": 1})]
    assert router.pending == 0


def test_a_shard_down_answers_what_it_holds_and_what_is_asked_of_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    wire = Wire()
    router = Router(2, wire.send, loop, JobCache())
    replies: list[dict[str, Any]] = []
    router.ask(0, "c1", {"cmd": "Count", "queue": "a"}, replies.append)
    _turn(loop)  # sent, in flight
    router.ask(0, "c1", {"cmd": "Count", "queue": "b"}, replies.append)  # queued, not sent
    router.control(0, {"t": "drain"})
    router.shard_down(0)
    unavailable = {"ok": False, "error": "Shard unavailable: shard 0 is restarting"}
    assert replies == [unavailable, unavailable] and router.pending == 0
    router.ask(0, "c1", {"cmd": "Count", "queue": "c"}, replies.append)
    router.control_now(0, {"t": "listen", "conn": "c1"})
    assert len(replies) == 2  # answered on the next turn, never inside the ask
    sent_before = len(wire.sent)
    _turn(loop)
    assert replies == [unavailable] * 3
    assert len(wire.sent) == sent_before  # nothing went to the dead shard
    router.down.discard(0)  # back up
    router.ask(0, "c1", {"cmd": "Count", "queue": "d"}, replies.append)
    _turn(loop)
    assert wire.sent[-1][1]["t"] == "req"
