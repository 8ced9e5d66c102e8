"""A PUSHF's parts, each admitted held and then released or cancelled (docs/protocol.md §20.3,
docs/cluster.md "Flows across nodes").

A flow's nodes are split by where their queue lives: a `LocalPart` is what this node's shards
hold (one PUSHF per shard, each with a hold in its request's envelope), a `PeerPart` what
another node holds (one `PUSHF {hold: true}` over the link to it, which that node admits as a
`LocalPart` of its own and keeps held until `PeerFlowRelease`). `Spread` runs the two phases
over any set of parts: every part admitted, then each released; one refused, then the parts
admitted (or whose answer was lost) cancelled and the client told why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

from shardq.core import FLOW_RELEASE
from shardq.runtime import _messages as msgs
from shardq.runtime._routing import shard_of
from shardq.runtime.frontend._forward import NODE_BUSY, NODE_UNAVAILABLE
from shardq.runtime.frontend._merge import SHARD_UNAVAILABLE
from shardq.runtime.frontend._replies import Client, OnReply, Reply, answer

if TYPE_CHECKING:
    import asyncio

    from shardq.runtime.frontend._router import Router

__all__ = [
    "INTERNAL_CONN",
    "LocalPart",
    "Part",
    "PeerPart",
    "Spread",
    "split_entries",
    "unavailable",
]

# The connection id of requests the front end makes for the shards themselves.
INTERNAL_CONN: Final = "flows"
# The envelope of a flow's part on one shard: its jobs stay undeliverable until released.
_HOLD: msgs.ReqEnvelope = {msgs.ENVELOPE_HOLD: True}
# A release a peer did not confirm is sent again this often, this many times: a release is
# idempotent, and a part left held waits for its node's next load of the partition.
_RELEASE_RETRY_S: Final = 1.0
_RELEASE_TRIES: Final = 10

# (address, command, on_reply): one request over the link to a peer node.
SendToPeer = Callable[[str, dict[str, Any], OnReply], None]


def _ignore(_reply: Reply) -> None:
    """A clean-up's reply: a job already gone is fine."""


def unavailable(reply: Reply) -> bool:
    """Whether `reply` says the shard or node could not answer (so "not found" is a guess)."""
    return str(reply.get("error", "")).startswith((SHARD_UNAVAILABLE, NODE_UNAVAILABLE, NODE_BUSY))


def split_entries(entries: list[Any]) -> list[dict[str, Any]]:
    """The nodes of a well-formed PUSHF, each with its place in the whole graph (`_index`)
    and, for a child whose parent is in the graph, the parent's queue in its input: its
    notices then go straight to that queue's shard and node, wherever the parent lives."""
    queues = {str(e["id"]): e["queue"] for e in entries}
    out: list[dict[str, Any]] = []
    for index, entry in enumerate(entries):
        given = entry.get("_index")
        node = {**entry, "_index": given if isinstance(given, int) else index}
        fields = entry.get("input")
        parent = fields.get("parentId") if isinstance(fields, Mapping) else None
        linked = isinstance(parent, str) and parent in queues
        if isinstance(fields, Mapping) and linked and "parentQueue" not in fields:
            node["input"] = {**fields, "parentQueue": queues[str(parent)]}
        out.append(node)
    return out


class Part(Protocol):
    """One share of a flow: admitted held, then released or cancelled."""

    entries: list[dict[str, Any]]

    def admit(self, done: OnReply) -> None: ...

    def release(self) -> None: ...

    def cancel(self) -> None: ...


class LocalPart:
    """The nodes of a flow this node's shards hold: one held PUSHF per shard."""

    def __init__(self, router: Router, conn: str, entries: list[dict[str, Any]]) -> None:
        self._r, self._conn, self.entries = router, conn, entries
        self._parts: dict[int, list[dict[str, Any]]] = {}
        for entry in entries:
            self._parts.setdefault(shard_of(entry["queue"], router.shards), []).append(entry)
        self._replies: dict[int, Reply] = {}
        self._done: OnReply = _ignore

    def admit(self, done: OnReply) -> None:
        self._done = done
        for shard, entries in self._parts.items():
            cmd = {"cmd": "PUSHF", "jobs": entries}
            self._r.ask(shard, self._conn, cmd, partial(self._admitted, shard), _HOLD)

    def _admitted(self, shard: int, reply: Reply) -> None:
        self._replies[shard] = reply
        if len(self._replies) < len(self._parts):
            return
        refused = next((r for r in self._replies.values() if not r.get("ok")), None)
        if refused is not None:
            for part_shard, part_reply in self._replies.items():
                if part_reply.get("ok"):
                    self._cancel(part_shard)
            self._done(refused)
            return
        jobs = [
            j for r in self._replies.values() for j in r.get("data", {}).get("jobs", ())
            if isinstance(j, Mapping)
        ]  # fmt: skip
        self._done({"ok": True, "data": {"jobs": jobs}})

    def release(self) -> None:
        for shard, entries in self._parts.items():
            cmd = {"cmd": FLOW_RELEASE, "ids": [str(e["id"]) for e in entries]}
            self._r.ask(shard, INTERNAL_CONN, cmd, _ignore)
            reply = self._replies.get(shard)
            if reply is not None:
                self._r.learn("PUSHF", shard, reply)

    def cancel(self) -> None:
        for shard in self._parts:
            self._cancel(shard)

    def _cancel(self, shard: int) -> None:
        for entry in self._parts[shard]:
            cancel = {"cmd": "Cancel", "id": str(entry["id"])}
            self._r.ask(shard, INTERNAL_CONN, cancel, _ignore)


class PeerPart:
    """The nodes of a flow another node holds: one `PUSHF {hold}` over the link to it."""

    def __init__(
        self,
        send: SendToPeer,
        loop: asyncio.AbstractEventLoop,
        address: str,
        entries: list[dict[str, Any]],
    ) -> None:
        self._send, self._loop, self._address, self.entries = send, loop, address, entries

    def admit(self, done: OnReply) -> None:
        self._send(self._address, {"cmd": "PUSHF", "jobs": self.entries, "hold": True}, done)

    def release(self, tries: int = _RELEASE_TRIES) -> None:
        ids = [str(e["id"]) for e in self.entries]
        queues = [e["queue"] for e in self.entries]
        cmd = {"cmd": "PeerFlowRelease", "ids": ids, "queues": queues}

        def released(reply: Reply) -> None:
            if reply.get("ok") is not True and tries > 1:
                self._loop.call_later(_RELEASE_RETRY_S, self.release, tries - 1)

        self._send(self._address, cmd, released)

    def cancel(self) -> None:
        for entry in self.entries:
            self._send(self._address, {"cmd": "Cancel", "id": str(entry["id"])}, _ignore)


class Spread:
    """One PUSHF over several parts (shards, nodes): all admitted then released, or none."""

    def __init__(self, client: Client, req: object, order: Sequence[str], parts: list[Part]):
        self._client, self._req, self._order, self._parts = client, req, order, parts
        self._replies: dict[int, Reply] = {}

    def start(self) -> None:
        for k, part in enumerate(self._parts):
            part.admit(partial(self._admitted, k))

    def _admitted(self, k: int, reply: Reply) -> None:
        self._replies[k] = reply
        if len(self._replies) < len(self._parts):
            return
        refused = next((r for r in self._replies.values() if not r.get("ok")), None)
        if refused is not None:
            for part_k, part in enumerate(self._parts):
                # A part whose answer was lost may have been admitted: cancel it too.
                if self._replies[part_k].get("ok") or unavailable(self._replies[part_k]):
                    part.cancel()
            answer(self._client, self._req, refused)
            return
        for part in self._parts:
            part.release()
        jobs = {
            j["id"]: j
            for r in self._replies.values()
            for j in r.get("data", {}).get("jobs", ())
            if isinstance(j, Mapping)
        }
        ordered = [jobs[i] for i in self._order if i in jobs]
        answer(self._client, self._req, {"ok": True, "data": {"jobs": ordered}})
