"""Two engines as two shards, a parent on one and its children on the other, joined by a channel
that loses, repeats and reorders notices, and by crashes that lose what was not committed.

Whatever happens, once the channel is drained the parent counted every completed child exactly
once (docs/protocol.md §17.4). The engines follow the shard's rules: a notice is acknowledged
only after the parent's shard committed what it changed; a crash rebuilds an engine from its
committed mutations alone (the outbox from its `flow` and `flowdel` rows).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.core import Engine, Mutation, fold_mutations

CHILDREN = 4
ACTIONS = ("work", "send", "dup", "commit_parent", "ack", "commit_child", "crash_parent",
           "crash_child", "drop")  # fmt: skip


class Side:
    """One engine with its committed and uncommitted mutations."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.engine = Engine(seed=seed)
        self.committed: list[Mutation] = []
        self.pending: list[Mutation] = []

    def apply(self, cmd: dict[str, Any], now: int) -> dict[str, Any]:
        reply, muts = self.engine.apply(cmd, now)
        self.pending.extend(muts)
        return reply

    def commit(self) -> None:
        self.committed.extend(self.pending)
        self.pending = []

    def crash(self, now: int) -> None:
        records, queues = fold_mutations(self.committed)
        outbox: dict[str, Any] = {}
        for m in self.committed:
            if m[0] == "flow":
                outbox[m[1]] = m[2]
            elif m[0] == "flowdel":
                outbox.pop(m[1], None)
        self.engine = Engine(seed=self.seed + now)
        self.pending = list(self.engine.restore(records.values(), queues, now))
        self.engine.load_flow_outbox(outbox.values())


def _start(now: int) -> tuple[Side, Side]:
    parent, child = Side(1), Side(2)
    kids = [f"c{i}" for i in range(CHILDREN)]
    node = {"id": "P", "queue": "p", "input": {"childrenIds": kids}}
    assert parent.apply({"cmd": "PUSHF", "jobs": [node]}, now)["ok"]
    nodes = [{"id": k, "queue": "c", "input": {"data": k, "parentId": "P", "parentQueue": "p"}}
             for k in kids]  # fmt: skip
    assert child.apply({"cmd": "PUSHF", "jobs": nodes}, now)["ok"]
    parent.commit()
    child.commit()
    return parent, child


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ACTIONS), max_size=60), st.randoms(use_true_random=False))
def test_every_completed_child_counts_once_through_losses_repeats_and_crashes(
    actions: list[str], rnd: Any
) -> None:
    now = 1_000
    parent, child = _start(now)
    channel: list[tuple[str, dict[str, Any]]] = []  # notices on their way
    applied: list[str] = []  # keys the parent applied (or deduped), waiting for its commit
    acks: list[str] = []  # keys whose application the parent committed

    def step(action: str) -> None:
        nonlocal applied
        if action == "work":
            pulled = child.apply({"cmd": "PULL", "queue": "c", "owner": "w"}, now)
            if pulled["job"] is not None:
                child.apply({"cmd": "ACK", "id": pulled["job"]["id"], "token": pulled["token"],
                             "result": pulled["job"]["data"]}, now)  # fmt: skip
        elif action == "send":  # the shard's first send, or a resend
            channel.extend(child.engine.flow_outbox.items())
            child.engine.take_flow_new()
        elif action == "dup" and channel:
            channel.append(rnd.choice(channel))
        elif action == "drop" and channel:
            channel.pop(rnd.randrange(len(channel)))
        elif action == "commit_parent":
            parent.commit()
            acks.extend(applied)
            applied = []
        elif action == "ack" and acks:
            child.pending.extend(child.engine.flow_acked(acks))
            acks.clear()
        elif action == "commit_child":
            child.commit()
        elif action == "crash_parent":
            parent.crash(now)
            applied = []
        elif action == "crash_child":
            child.crash(now)
        if channel and rnd.random() < 0.5:
            key, notice = channel.pop(rnd.randrange(len(channel)))
            assert parent.apply({"cmd": "FlowNotify", "items": [notice]}, now)["ok"]
            applied.append(key)

    for action in actions:
        now += 7
        step(action)
    # Drain: the shards keep resending and committing until nothing is owed. Each round
    # finishes at least one child or acknowledges at least one notice, so this ends.
    for _ in range(10 * CHILDREN):
        now += 7_000
        for action in ("commit_child", "work", "commit_child", "send"):
            step(action)
        while channel:
            step("commit_parent")
        step("commit_parent")
        step("ack")
        step("commit_child")
        if not child.engine.flow_outbox and all(
            child.engine.jobs[k].state == "completed" for k in child.engine.jobs
        ):
            break
    done = {k: j.result for k, j in child.engine.jobs.items() if j.state == "completed"}
    assert len(done) == CHILDREN
    job = parent.engine.jobs["P"]
    assert job.opts["childrenValues"] == done
    assert job.children_completed == CHILDREN
    assert job.state == "waiting"
