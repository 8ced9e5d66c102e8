"""Two engines as two shards, a parent on one and its children on the other, joined by a channel
that loses, repeats and reorders notices, and by crashes that lose what was not committed.

Whatever happens, once the channel is drained the parent counted every completed child exactly
once (docs/protocol.md §20.4). The engines follow the shard's rules: a notice is acknowledged
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
        reply, muts = (outcome := self.engine.apply(cmd, now)).reply, outcome.mutations
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
        self.engine.flows.load_outbox(outbox.values())


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


class World:
    """The two sides, the channel between them, and what the parent still has to confirm."""

    def __init__(self, rnd: Any) -> None:
        self.rnd = rnd
        self.now = 1_000
        self.parent, self.child = _start(self.now)
        self.channel: list[tuple[str, dict[str, Any]]] = []  # notices on their way
        self.applied: list[str] = []  # keys the parent applied (or deduped), not committed
        self.acks: list[str] = []  # keys whose application the parent committed

    def step(self, action: str) -> None:
        getattr(self, action)()
        if self.channel and self.rnd.random() < 0.5:
            self.deliver()

    def deliver(self) -> None:
        key, notice = self.channel.pop(self.rnd.randrange(len(self.channel)))
        assert self.parent.apply({"cmd": "FlowNotify", "items": [notice]}, self.now)["ok"]
        self.applied.append(key)

    def work(self) -> None:
        pulled = self.child.apply({"cmd": "PULL", "queue": "c", "owner": "w"}, self.now)
        if pulled["job"] is not None:
            ack = {"cmd": "ACK", "id": pulled["job"]["id"], "token": pulled["token"]}
            self.child.apply({**ack, "result": pulled["job"]["data"]}, self.now)

    def send(self) -> None:  # the shard's first send, or a resend
        self.channel.extend(self.child.engine.flows.outbox.items())
        self.child.engine.flows.take_new()

    def dup(self) -> None:
        if self.channel:
            self.channel.append(self.rnd.choice(self.channel))

    def drop(self) -> None:
        if self.channel:
            self.channel.pop(self.rnd.randrange(len(self.channel)))

    def commit_parent(self) -> None:
        self.parent.commit()
        self.acks.extend(self.applied)
        self.applied = []

    def ack(self) -> None:
        if self.acks:
            self.child.pending.extend(self.child.engine.flows.acked(self.acks))
            self.acks = []

    def commit_child(self) -> None:
        self.child.commit()

    def crash_parent(self) -> None:
        self.parent.crash(self.now)
        self.applied = []

    def crash_child(self) -> None:
        self.child.crash(self.now)

    def settled(self) -> bool:
        jobs = self.child.engine.jobs
        return not self.child.engine.flows.outbox and all(
            j.state == "completed" for j in jobs.values()
        )

    def drain(self) -> None:
        """The shards keep resending and committing until nothing is owed; each round
        finishes a child or gets a notice acknowledged, so a few rounds per child suffice."""
        for _ in range(10 * CHILDREN):
            self.now += 7_000
            for action in ("commit_child", "work", "commit_child", "send"):
                self.step(action)
            while self.channel:
                self.deliver()
            for action in ("commit_parent", "ack", "commit_child"):
                getattr(self, action)()
            if self.settled():
                return


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ACTIONS), max_size=60), st.randoms(use_true_random=False))
def test_every_completed_child_counts_once_through_losses_repeats_and_crashes(
    actions: list[str], rnd: Any
) -> None:
    world = World(rnd)
    for action in actions:
        world.now += 7
        world.step(action)
    world.drain()
    done = {k: j.result for k, j in world.child.engine.jobs.items() if j.state == "completed"}
    assert len(done) == CHILDREN
    job = world.parent.engine.jobs["P"]
    assert job.opts["childrenValues"] == done
    assert job.children_completed == CHILDREN
    assert job.state == "waiting"
