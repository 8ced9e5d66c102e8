"""What the front end says about a request travels beside the client's command, never in it:
the connection and request id in the `req` item, a PULLB's wire mode and a flow part's hold in
its envelope (`shardq/runtime/_messages.py`). Keys of those names in a client's map mean
nothing to the shard."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from shardq.core import FLOW_RELEASE, Engine
from shardq.protocol._prepacked import JS_NUMBERS, PLAIN_NUMBERS, WIRE_MODE_KEY
from shardq.runtime import _messages as msgs
from shardq.runtime._routing import shard_of
from shardq.runtime.frontend._dispatch import Dispatcher
from shardq.runtime.links._control import unpack
from shardq.runtime.shard._core import ShardCore

T0 = 1_700_000_000_000


class Shard:
    """One ShardCore fed raw `req` items; the writer confirms every batch at once."""

    def __init__(self) -> None:
        self.core = ShardCore(0, Engine(seed=1, compact_pulls=True))
        self.now = T0
        self.rid = 0
        self.replies: dict[int, dict[str, Any]] = {}

    def send(self, *items: list[Any]) -> None:
        self.core.handle(msgs.req(list(items)), self.now)  # type: ignore[arg-type]
        self.end()

    def item(self, cmd: dict[str, Any], conn: str = "t1", envelope: Any = None) -> list[Any]:
        self.rid += 1
        return [conn, self.rid, cmd] if envelope is None else [conn, self.rid, cmd, envelope]

    def call(self, cmd: dict[str, Any], conn: str = "t1", envelope: Any = None) -> dict[str, Any]:
        item = self.item(cmd, conn, envelope)
        self.send(item)
        return self.replies.pop(item[1])

    def end(self) -> None:
        for _ in range(3):  # the done of a batch can free replies and send more
            confirmed = None
            for dest, out in self.core.finish_turn(self.now):
                if dest == "writer" and out["t"] == msgs.MUTS:
                    confirmed = out["seq"]
                elif dest == "front" and out["t"] == msgs.REP:
                    for _conn, rid, reply in out["items"]:
                        self.replies[rid] = reply
            if confirmed is None:
                return
            self.core.handle(msgs.done(confirmed), self.now)  # type: ignore[arg-type]


@pytest.fixture
def s() -> Shard:
    return Shard()


def _active(s: Shard, job_id: str) -> bool:
    job = s.core.engine.find(job_id)
    return job is not None and job.state == "active"


def test_a_pull_is_tracked_under_its_items_connection(s: Shard) -> None:
    job_id = s.call({"cmd": "PUSH", "queue": "q", "data": 1})["id"]
    # A `_conn` in the client's map names nothing: the item's connection holds the job.
    pulled = s.call({"cmd": "PULL", "queue": "q", "owner": "w", "_conn": "t2"}, conn="t1")
    assert pulled["job"]["id"] == job_id
    s.core.handle(msgs.close("t2"), s.now)  # type: ignore[arg-type]
    s.end()
    assert _active(s, job_id)
    s.core.handle(msgs.close("t1"), s.now)  # type: ignore[arg-type]
    s.end()
    assert not _active(s, job_id)
    assert s.call({"cmd": "GetState", "id": job_id})["state"] == "waiting"


def test_a_client_cannot_name_a_connection_in_a_push(s: Shard) -> None:
    reply = s.call({"cmd": "PUSH", "queue": "q", "data": 1, "_conn": "t9"})
    assert reply == {"ok": False, "error": "Unknown option: _conn"}


def _flow(job_id: str) -> dict[str, Any]:
    return {"cmd": "PUSHF", "jobs": [{"id": job_id, "queue": "q", "input": {"data": 1}}]}


@pytest.mark.parametrize("durable", [False, True])
def test_a_flow_part_held_by_its_envelope_waits_for_its_release(s: Shard, durable: bool) -> None:
    cmd = _flow("f1")
    cmd["jobs"][0]["input"]["durable"] = durable
    assert s.call(cmd, envelope={msgs.ENVELOPE_HOLD: True})["ok"]
    assert s.call({"cmd": "PULL", "queue": "q"})["job"] is None
    assert s.call({"cmd": FLOW_RELEASE, "ids": ["f1"]}, conn="flows")["ok"]
    assert s.call({"cmd": "PULL", "queue": "q"})["job"]["id"] == "f1"


def test_a_hold_in_the_clients_map_holds_nothing(s: Shard) -> None:
    assert s.call({**_flow("f2"), "_hold": True})["ok"]
    assert s.call({"cmd": "PULL", "queue": "q"})["job"]["id"] == "f2"


def _pullb(timeout: int = 0, **extra: Any) -> dict[str, Any]:
    return {"cmd": "PULLB", "queue": "q", "count": 5, "timeout": timeout, **extra}


def test_a_pullb_is_packed_for_the_wire_mode_of_its_envelope(s: Shard) -> None:
    s.call({"cmd": "PUSH", "queue": "q", "data": 1})
    reply = s.call(_pullb(), envelope={msgs.ENVELOPE_WIRE: JS_NUMBERS})
    assert reply[WIRE_MODE_KEY] == JS_NUMBERS and len(reply["jobs"]) == 1
    # A client's `_wire_mode` is not the front end's word: the reply is left as it is.
    s.call({"cmd": "PUSH", "queue": "q", "data": 2})
    reply = s.call(_pullb(_wire_mode=PLAIN_NUMBERS))
    assert WIRE_MODE_KEY not in reply and len(reply["jobs"]) == 1


def test_a_parked_pullb_keeps_its_envelopes_wire_mode(s: Shard) -> None:
    parked = s.item(_pullb(timeout=5_000), envelope={msgs.ENVELOPE_WIRE: PLAIN_NUMBERS})
    s.send(parked)
    assert parked[1] not in s.replies
    s.call({"cmd": "PUSH", "queue": "q", "data": 1})
    reply = s.replies.pop(parked[1])
    assert reply[WIRE_MODE_KEY] == PLAIN_NUMBERS and len(reply["jobs"]) == 1


@pytest.mark.parametrize(
    "item",
    [
        ["t1", 1, {"cmd": "Ping"}, "wire"],  # an envelope that is not a map
        [7, 1, {"cmd": "ListQueues"}],  # a connection that is not a str
        ["t1", 1, {"cmd": "ListQueues"}, {}, {}],
        ["t1", 1],
    ],
)
def test_a_malformed_item_is_dropped_and_the_rest_answered(s: Shard, item: list[Any]) -> None:
    good = s.item({"cmd": "ListQueues"})
    with capture_logs() as logs:
        s.send(item, good)
    assert any(line["event"] == "malformed request item dropped" for line in logs)
    assert set(s.replies) == {good[1]}


# -- the front end's side: what it puts in the items -----------------------------------------


class _Client:
    def __init__(self, conn: str, wire_mode: int | None) -> None:
        self.conn = conn
        self.authenticated = True
        if wire_mode is not None:
            self.wire_mode = wire_mode
        self.sent: list[dict[str, Any]] = []

    def send(self, reply: dict[str, Any]) -> None:
        self.sent.append(reply)

    def drop(self, reason: str) -> None:
        raise AssertionError(reason)


def _sent_items(shards: int, client: _Client, frame: dict[str, Any]) -> list[list[Any]]:
    """The `req` items the dispatcher sends for one client frame, over every shard."""
    loop = asyncio.new_event_loop()
    sent: list[dict[str, Any]] = []
    try:
        dispatcher = Dispatcher(shards, lambda _shard, data: sent.append(unpack(data)), loop)
        dispatcher.handle(client, frame)
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    return [item for msg in sent if msg["t"] == msgs.REQ for item in msg["items"]]


@pytest.mark.parametrize("mode", [None, PLAIN_NUMBERS, JS_NUMBERS])
def test_the_front_end_puts_a_pullbs_wire_mode_in_the_envelope(mode: int | None) -> None:
    frame = {"cmd": "PULLB", "queue": "q", "count": 3, "_wire_mode": 9, "reqId": "1"}
    (item,) = _sent_items(1, _Client("t5", mode), frame)
    assert item[0] == "t5"
    assert item[2] == {"cmd": "PULLB", "queue": "q", "count": 3, "_wire_mode": 9}
    assert item[3:] == ([] if mode is None else [{msgs.ENVELOPE_WIRE: mode}])


def test_the_front_end_sends_a_push_as_the_client_wrote_it() -> None:
    frame = {"cmd": "PUSH", "queue": "q", "data": {"n": 1}, "reqId": "1"}
    (item,) = _sent_items(1, _Client("t5", JS_NUMBERS), frame)
    assert item[0] == "t5" and item[2] == {"cmd": "PUSH", "queue": "q", "data": {"n": 1}}
    assert len(item) == 3


def test_the_front_end_holds_each_part_of_a_flow_across_shards() -> None:
    queues = [f"q{i}" for i in range(40)]
    other = next(q for q in queues if shard_of(q, 2) != shard_of("q0", 2))
    nodes = [
        {"id": "p", "queue": "q0", "input": {"data": 1, "childrenIds": ["c"]}},
        {"id": "c", "queue": other, "input": {"data": 2, "parentId": "p", "parentQueue": "q0"}},
    ]
    items = _sent_items(2, _Client("t5", None), {"cmd": "PUSHF", "jobs": nodes, "reqId": "1"})
    assert len(items) == 2
    for item in items:
        assert item[0] == "t5" and item[3] == {msgs.ENVELOPE_HOLD: True}
        assert set(item[2]) == {"cmd", "jobs"}
