"""Flows whose jobs live on different nodes (docs/cluster.md "Flows across nodes").

Several nodes on one database: each queue's partition has one owner. What the front end does
for flows between its shards (`_flows.py`) it does between nodes too, over the peer link
(`_forward.PeerLink`, a `NoForward {node}` connection), with four requests that only a
peer's link may send:

- `PUSHF {jobs, hold: true}`: this node's part of a flow another node coordinates, admitted
  held (all of it or none, every queue served here) until `PeerFlowRelease {ids, queues}`;
  or cancelled, job by job, with `Cancel`.
- `PeerFlowNotify {queue?, items}`: child-finished notices for parents on `queue` (served
  here, or the request is refused with the guard's `MOVED`/`Partition unavailable`); without
  `queue`, every shard here applies what it can. The answer comes once every shard that
  applied a notice committed it; only then does the sender tell the child's shard
  `flowack`, and the child's shard forgets the notice. Anything not acknowledged (a node
  dead, a partition moving, this node restarting) is sent again from the child's outbox,
  which the child's partition's next owner loads from the database. A parent applies a
  child's notice only while it waits for that child, so a notice delivered twice (a stale
  node's resend, a resend after a lost answer) counts once.
- `PeerFlowHeld {ids}`: which of these ids this node's shards hold, for the look at a parent
  whose children were never pushed (`_orphans.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from shardq.core import FLOW_HELD, FLOW_NOTIFY, FLOW_RELEASE
from shardq.protocol import error_reply
from shardq.runtime._routing import shard_of
from shardq.runtime.frontend._flow_parts import INTERNAL_CONN, LocalPart, unavailable
from shardq.runtime.frontend._forward import FORWARD, PARTITION_UNAVAILABLE, PEER, Forwarder
from shardq.runtime.frontend._merge import is_found
from shardq.runtime.frontend._replies import Client, Gather, OnReply, Reply, answer

if TYPE_CHECKING:
    from shardq.runtime.frontend._router import Router

__all__ = ["INTERNAL", "LOCAL", "NodeMap", "PeerFlowCommands", "ask_anywhere", "is_peer"]

LOCAL: Final = ""  # `NodeMap.where` of a queue this node serves
PEER_ONLY: Final = "Peer command: only another node's link may send "


class _Internal:
    """The front end's own requests (a flow's part, a notice, a lookup) as a client: not a
    peer's, so a lookup of a job here fans out to the other nodes."""

    conn = INTERNAL_CONN
    authenticated = True
    no_forward = FORWARD

    def send(self, reply: Reply) -> None:
        """Its requests are answered through callbacks, never `send`."""

    def drop(self, reason: str) -> None:
        """Never dropped."""


INTERNAL: Final = _Internal()


def is_peer(client: Client) -> bool:
    return getattr(client, "no_forward", FORWARD) == PEER


class NodeMap:
    """Where a queue lives (the partition guard's answer) and the links to the other nodes."""

    def __init__(self, refusal: Callable[[str], str | None], forwarder: Forwarder) -> None:
        self._refusal = refusal
        self._forwarder = forwarder

    def where(self, queue: str) -> tuple[str | None, str | None]:
        """(`LOCAL`, None), (the owner's address, the guard's `MOVED`), or (None, the error
        to retry on: the partition is moving)."""
        error = self._refusal(queue)
        if error is None:
            return LOCAL, None
        if error.startswith("MOVED "):
            return error.rsplit(" ", 1)[1], error
        return None, error

    def send(self, address: str, cmd: dict[str, Any], on_reply: OnReply) -> None:
        self._forwarder.forwards += 1
        self._forwarder.link(address).send(cmd, on_reply)

    def peer_addresses(self) -> Sequence[str]:
        return self._forwarder.peers()

    def gather_peers(self, cmd: dict[str, Any], done: Callable[[list[Reply]], None]) -> bool:
        """`cmd` to every other live node; False (nothing sent) when there is none."""
        return self._forwarder.gather_peers(INTERNAL, cmd, done)


def ask_anywhere(router: Router, name: str, cmd: dict[str, Any],
                 done: Callable[[bool, Reply], None]) -> None:  # fmt: skip
    """Every shard here, then (on a miss, with several nodes) every other node: `done(found,
    reply)` with the reply that shows the job, or the "not found" (an unavailable shard's or
    node's error when one could not answer: then "not found" is only a guess)."""

    def here(found: int | None, reply: Reply) -> None:
        if found is not None:
            done(True, reply)
            return
        peers = router.peers
        if peers is not None and peers(INTERNAL, name, cmd, reply, partial(there, reply)):
            return
        done(False, reply)

    def there(local: Reply, reply: Reply) -> None:
        found = is_found(name, reply) and not unavailable(reply)
        done(found, reply if found or unavailable(reply) else local)

    router.ask_first(INTERNAL_CONN, name, cmd, here)


class PeerFlowCommands:
    """The requests of another node's link for the flows it coordinates (module docstring)."""

    def __init__(self, router: Router, nodes: Callable[[], NodeMap | None]) -> None:
        self._r = router
        self._nodes = nodes
        self.handlers = {
            "PeerFlowNotify": self.notify,
            "PeerFlowRelease": self.release,
            "PeerFlowHeld": self.held,
        }

    def _refused(self, client: Client, req: object, name: str) -> bool:
        if is_peer(client) and self._nodes() is not None:
            return False
        answer(client, req, error_reply(PEER_ONLY + name))
        return True

    def _not_here(self, queues: Sequence[object]) -> str | None:
        """The guard's refusal of the first of `queues` this node does not serve now."""
        nodes = self._nodes()
        for queue in queues:
            if nodes is not None and isinstance(queue, str):
                where, error = nodes.where(queue)
                if where is None:
                    return error
                if where != LOCAL:
                    # The sender's map and this node's disagree for a moment (a partition
                    # changing hands): a refusal to retry, as a forward's `MOVED` is relayed.
                    return (f"{PARTITION_UNAVAILABLE}: this node does not hold queue {queue}'s "
                            "partition by its own map (it is changing hands); retry")  # fmt: skip
        return None

    def held_part(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        """`PUSHF {hold: true}`: this node's part of another node's flow, admitted held."""
        if self._refused(client, req, "PUSHF hold"):
            return
        entries = frame.get("jobs")
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("queue"), str) and isinstance(e.get("id"), str)
            for e in entries
        ):
            answer(client, req, error_reply("jobs must be a list of {id, queue, input}"))
            return
        error = self._not_here([e["queue"] for e in entries])
        if error is not None:
            answer(client, req, error_reply(error))
            return
        LocalPart(self._r, client.conn, entries).admit(partial(answer, client, req))

    def release(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        if self._refused(client, req, "PeerFlowRelease"):
            return
        by_shard: dict[int, list[str]] = {}
        for job_id, queue in zip(frame["ids"], frame["queues"], strict=False):
            by_shard.setdefault(shard_of(queue, self._r.shards), []).append(str(job_id))
        if not by_shard:
            answer(client, req, {"ok": True})
            return
        gather = Gather(len(by_shard), partial(self._all_ok, client, req))
        for k, (shard, ids) in enumerate(by_shard.items()):
            self._r.cache.learn(ids, shard)
            cmd = {"cmd": FLOW_RELEASE, "ids": ids}
            self._r.ask(shard, INTERNAL_CONN, cmd, partial(gather.part, k))

    def notify(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        if self._refused(client, req, "PeerFlowNotify"):
            return
        queue = frame.get("queue")
        cmd = {"cmd": FLOW_NOTIFY, "items": frame["items"]}
        if isinstance(queue, str):
            error = self._not_here([queue])
            if error is not None:
                answer(client, req, error_reply(error))
                return
            self._r.ask(shard_of(queue, self._r.shards), INTERNAL_CONN, cmd,
                        partial(answer, client, req))  # fmt: skip
            return
        gather = Gather(self._r.shards, partial(self._all_ok, client, req))
        for shard in range(self._r.shards):
            self._r.ask(shard, INTERNAL_CONN, cmd, partial(gather.part, shard))

    def held(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        if self._refused(client, req, "PeerFlowHeld"):
            return

        def done(replies: list[Reply]) -> None:
            error = next((r for r in replies if r.get("ok") is not True), None)
            if error is not None:
                answer(client, req, error)
                return
            held = sorted({h for r in replies for h in r.get("held") or () if isinstance(h, str)})
            answer(client, req, {"ok": True, "held": held})

        gather = Gather(self._r.shards, done)
        cmd = {"cmd": FLOW_HELD, "ids": frame["ids"]}
        for shard in range(self._r.shards):
            self._r.ask(shard, INTERNAL_CONN, cmd, partial(gather.part, shard))

    @staticmethod
    def _all_ok(client: Client, req: object, replies: list[Reply]) -> None:
        error = next((r for r in replies if r.get("ok") is not True), None)
        answer(client, req, error if error is not None else {"ok": True})
