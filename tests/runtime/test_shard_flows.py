"""The crash-safety contract of flows in one shard, turn by turn (docs/protocol.md §20.4).

- A child's shard emits its notice after the writer batch that stores both the child's outcome
  and the notice, sends it again every `flow_resend_ms` until acknowledged, and deletes it
  (`flowdel`) only on `flowack`.
- A parent's shard answers `FlowNotify` only once the batch with the fan-in it changed is
  committed, so an acknowledged notice can never be lost by a crash of the parent's shard.
"""

from __future__ import annotations

from typing import Any

from shardq.core import Engine
from shardq.runtime.shard._core import Outgoing, ShardCore

T0 = 1_700_000_000_000
RESEND_MS = 500


class Shard:
    def __init__(self) -> None:
        self.core = ShardCore(0, Engine(seed=3), flow_resend_ms=RESEND_MS)
        self.now = T0
        self.rid = 0

    def turn(self, *cmds: dict[str, Any]) -> tuple[list[Outgoing], list[int]]:
        items, rids = [], []
        for cmd in cmds:
            self.rid += 1
            rids.append(self.rid)
            items.append(["t1", self.rid, cmd])
        if items:
            self.core.handle({"t": "req", "items": items}, self.now)
        return self.core.finish_turn(self.now), rids

    def message(self, msg: dict[str, Any]) -> list[Outgoing]:
        self.core.handle(msg, self.now)
        return self.core.finish_turn(self.now)


def _replies(out: list[Outgoing]) -> dict[int, dict[str, Any]]:
    return {rid: r for d, m in out if m["t"] == "rep" for _c, rid, r in m["items"]}


def _kinds(out: list[Outgoing]) -> list[str]:
    return [m["t"] for _d, m in out]


def test_a_childs_notice_is_stored_with_its_outcome_and_resent_until_acknowledged() -> None:
    shard = Shard()
    out, _ = shard.turn({"cmd": "PUSH", "queue": "c", "data": 1, "parentId": "P",
                         "parentQueue": "p"})  # fmt: skip
    pulled = shard.turn({"cmd": "PULL", "queue": "c", "owner": "w"})[0]
    job = _replies(pulled)[2]
    out, _ = shard.turn({"cmd": "ACK", "id": job["job"]["id"], "token": job["token"]})
    assert _kinds(out) == ["muts", "flow", "rep"]
    muts = out[0][1]["muts"]
    assert [m[0] for m in muts] == ["updb", "flow"]  # the outcome and the notice, one batch
    ((key, notice),) = out[1][1]["items"]
    assert notice["kind"] == "completed" and notice["pq"] == "p"
    assert shard.core.poll_timeout(shard.now) == RESEND_MS

    shard.now += RESEND_MS - 1
    assert "flow" not in _kinds(shard.turn()[0])
    shard.now += 1
    again = shard.turn()[0]
    assert _kinds(again) == ["flow"] and again[0][1]["items"] == [[key, notice]]

    acked = shard.message({"t": "flowack", "keys": [key]})
    assert [list(m) for m in acked[0][1]["muts"]] == [["flowdel", key]]
    assert shard.core.engine.flows.outbox == {}
    shard.now += 10 * RESEND_MS
    assert "flow" not in _kinds(shard.turn()[0])
    assert shard.core.flows.next_deadline() is None


def test_a_parent_answers_a_notice_only_once_its_fan_in_is_committed() -> None:
    shard = Shard()
    nodes = [{"id": "P", "queue": "p", "input": {"childrenIds": ["c0"]}}]
    shard.turn({"cmd": "PUSHF", "jobs": nodes})
    shard.message({"t": "done", "seq": shard.core.seq})
    notice = {"parent": "P", "child": "c0", "kind": "completed", "result": 7, "policy": None}
    out, (rid,) = shard.turn({"cmd": "FlowNotify", "items": [notice]})
    # No reply yet (the fan-in is not on disk), and the writer is asked to commit at once.
    assert _kinds(out) == ["muts", "flush"]
    seq = out[0][1]["seq"]
    # The same notice again (a resend) changes nothing and waits for the same commit.
    out, (rid2,) = shard.turn({"cmd": "FlowNotify", "items": [notice]})
    assert _replies(out) == {}
    replies = _replies(shard.message({"t": "done", "seq": seq}))
    assert replies[rid] == {"ok": True, "applied": 1}
    assert replies[rid2] == {"ok": True, "applied": 0}
    job = shard.core.engine.jobs["P"]
    assert job.children_completed == 1 and job.state == "waiting"


def test_a_notice_whose_commit_failed_is_not_acknowledged() -> None:
    shard = Shard()
    shard.turn({"cmd": "PUSHF", "jobs": [{"id": "P", "queue": "p",
                                          "input": {"childrenIds": ["c0"]}}]})  # fmt: skip
    shard.message({"t": "done", "seq": shard.core.seq})
    notice = {"parent": "P", "child": "c0", "kind": "completed", "result": 7, "policy": None}
    out, (rid,) = shard.turn({"cmd": "FlowNotify", "items": [notice]})
    replies = _replies(shard.message({"t": "fail", "seq": out[0][1]["seq"], "error": "full"}))
    assert replies[rid]["ok"] is False  # the child's shard keeps it and sends it again
