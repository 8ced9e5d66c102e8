"""How the front end carries flows between shards (docs/protocol.md §20).

- **Notices.** A child's shard sends `{"t": "flow", "shard": i, "items": [[key, notice]]}`;
  each notice goes to the shard of its parent's queue as an internal `FlowNotify`. That shard
  answers once what the notice changed is committed, and only then is the child's shard told
  `{"t": "flowack", "keys": [...]}`: it forgets the notice. Anything lost on the way (a shard
  restarting, this process restarting) is sent again by the child's shard.
- **Parents that must exist.** `UpdateParent` (bunqueue-client 0.1.5's legacy flow) links a
  child to a parent some shard must hold: the front end asks every shard for the parent's
  state first. A PUSH or PUSHB entry naming its parent's queue (`parentQueue`, or
  `data.__parentQueue`) asks that queue's shard. Either is refused `Parent job not found: X`,
  as bunqueue does, rather than leave a child reporting to no one. A bare `parentId`, or
  bunqueue-client's placeholder "pending", is not checked (a forward reference).
- **PUSHF over several shards**, in two phases (`_flow_parts.py`). Each shard gets its part
  as one PUSHF with a hold in its request's envelope: it admits all of its nodes or none, and
  keeps them from delivery. If every part is admitted, each shard gets a `FlowRelease` and
  the flow starts; if one is refused, the parts already admitted are cancelled (their jobs
  never ran) and the client gets the error.
- **Several nodes** (`span_nodes`, docs/cluster.md): the same over the other nodes too. A
  PUSHF's nodes on another node's queues go to that node as one held part; notices for a
  parent on another node's queue go to that node (`_flow_nodes.py`); a parent, or a child
  to cancel, not found here is looked for on the other nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from shardq.core import FLOW_NOTIFY
from shardq.core._graph import flow_reference_error, graph_error
from shardq.core._names import PENDING_PARENT
from shardq.runtime import _messages as msgs
from shardq.runtime._routing import shard_of
from shardq.runtime.frontend._flow_nodes import (
    INTERNAL,
    LOCAL,
    NodeMap,
    PeerFlowCommands,
    ask_anywhere,
)
from shardq.runtime.frontend._flow_parts import (
    INTERNAL_CONN,
    LocalPart,
    Part,
    PeerPart,
    Spread,
    split_entries,
    unavailable,
)
from shardq.runtime.frontend._merge import is_found
from shardq.runtime.frontend._orphans import OrphanWatch
from shardq.runtime.frontend._replies import Client, Reply, StandIn, answer
from shardq.runtime.frontend._router import Router

if TYPE_CHECKING:
    import asyncio

    from shardq.runtime.frontend._forward import Forwarder

__all__ = ["FlowRoutes", "Forward"]


class Forward(Protocol):
    """Sends a command on to its shard as the dispatcher does, past the parent check."""

    def __call__(self, client: Client, req: object, name: str, frame: dict[str, Any]) -> None: ...


_INTERNAL_CONN = INTERNAL_CONN
_unavailable = unavailable


class FlowRoutes:
    """PUSHF and RemoveUnprocessedChildren (`handlers`), and the flow notices between shards,
    over the router."""

    def __init__(self, router: Router, loop: asyncio.AbstractEventLoop, forward: Forward) -> None:
        """`forward` sends a command on to its shard as the dispatcher does, past the
        parent check (`check_parents`): for the pushes and UpdateParents checked here."""
        self._r = router
        self._loop = loop
        self._forward = forward
        self.orphans = OrphanWatch(router, loop)
        # Several nodes on one database: where each queue lives, and the links to the others.
        self.nodes: NodeMap | None = None
        self.peer = PeerFlowCommands(router, lambda: self.nodes)
        self.handlers = {
            "PUSHF": self.pushf,
            "RemoveUnprocessedChildren": self.remove_unprocessed,
            "UpdateParent": self.update_parent,
            **self.peer.handlers,
        }

    def span_nodes(self, refusal: Callable[[str], str | None], forwarder: Forwarder) -> None:
        """Carry flows between this node and the others (docs/cluster.md): `refusal` is the
        partition guard's answer for a queue (None: served here)."""
        self.nodes = NodeMap(refusal, forwarder)
        self.orphans.nodes = self.nodes

    # -- notices ---------------------------------------------------------------------------

    def on_notices(self, msg: Mapping[str, Any]) -> None:
        """Route a child's shard's notices to their parents' shards."""
        r = self._r
        origin, items = msg.get("shard"), msg.get("items")
        if not isinstance(origin, int) or not isinstance(items, list):
            return
        nodes = self.nodes
        by_shard: dict[int, list[list[Any]]] = {}
        by_peer: dict[tuple[str, str], list[list[Any]]] = {}
        unrouted: list[list[Any]] = []
        for item in items:
            if isinstance(item, list) and len(item) == 2 and isinstance(item[1], Mapping):
                queue = item[1].get("pq")
                if not isinstance(queue, str):
                    unrouted.append(item)
                    continue
                where = nodes.where(queue)[0] if nodes is not None else LOCAL
                if where == LOCAL:
                    by_shard.setdefault(shard_of(queue, r.shards), []).append(item)
                elif where is not None:
                    by_peer.setdefault((where, queue), []).append(item)
                # else: the parent's partition is moving: the child's shard sends it again.
        for shard, part in by_shard.items():
            self._notify([shard], origin, part)
        for (address, queue), part in by_peer.items():
            self._notify([], origin, part, [(address, queue)])
        if unrouted:
            # A child that names its parent but not the parent's queue: only the shard (or
            # node) that holds the parent applies it; done once every one of them answered.
            peers = [] if nodes is None else [(a, None) for a in nodes.peer_addresses()]
            self._notify(list(range(r.shards)), origin, unrouted, peers)

    def _notify(
        self,
        shards: list[int],
        origin: int,
        part: list[list[Any]],
        peers: Sequence[tuple[str, str | None]] = (),
    ) -> None:
        keys = [k for k, _ in part]
        notices = [n for _, n in part]
        answers: list[Reply] = []
        expected = len(shards) + len(peers)

        def answered(reply: Reply) -> None:
            answers.append(reply)
            if len(answers) == expected and all(r.get("ok") for r in answers):
                self._notified(origin, keys)

        for shard in shards:
            cmd = {"cmd": FLOW_NOTIFY, "items": notices}
            self._r.ask(shard, _INTERNAL_CONN, cmd, answered)
        nodes = self.nodes
        for address, queue in peers:
            if nodes is not None:
                peer_cmd: dict[str, Any] = {"cmd": "PeerFlowNotify", "items": notices}
                if queue is not None:
                    peer_cmd["queue"] = queue
                nodes.send(address, peer_cmd, answered)

    def _notified(self, origin: int, keys: list[Any]) -> None:
        """Every shard that had to apply the notices committed them: the child's shard may
        forget them. (A shard that did not answer ok gets them again, from a resend.)"""
        r = self._r
        if origin in r.down or not 0 <= origin < r.shards:
            return
        r.control(origin, msgs.flowack(keys))

    # -- PUSHF -----------------------------------------------------------------------------

    def pushf(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        r = self._r
        if frame.pop("hold", None):
            # Another node's flow, whose whole graph it checked: a part held here.
            self.peer.held_part(client, req, frame)
            return
        error = _whole_graph_error(frame.get("jobs"))
        if error:
            # Checked on the whole graph here: a shard sees only its part of a cycle, and
            # of the links that leave the graph (`flow_reference_error`).
            answer(client, req, {"ok": False, "error": error})
            return
        entries = frame.get("jobs")
        if not _well_formed(entries):
            r.ask(0, client.conn, frame, partial(self._one_shard, client, req, 0))  # it says why
            return
        assert isinstance(entries, list)
        parts = self._parts(client, req, split_entries(entries))
        if parts is None:
            return  # answered: a queue's partition is moving
        local = parts.get(LOCAL)
        shards = {shard_of(e["queue"], r.shards) for e in local} if local else set()
        if len(parts) == 1 and local is not None and len(shards) == 1:
            shard = next(iter(shards))  # one shard holds it all: one step
            r.ask(shard, client.conn, frame, partial(self._one_shard, client, req, shard))
            return
        order = [str(e["id"]) for e in entries]
        Spread(client, req, order, self._part_list(client, parts)).start()

    def _parts(
        self, client: Client, req: object, entries: list[dict[str, Any]]
    ) -> dict[str, list[dict[str, Any]]] | None:
        """The nodes by where their queue lives (`LOCAL` or a peer's address); None (and
        the client answered) when a queue's partition is moving."""
        nodes = self.nodes
        if nodes is None:
            return {LOCAL: entries}
        parts: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            where, error = nodes.where(entry["queue"])
            if where is None:
                answer(client, req, {"ok": False, "error": error})
                return None
            parts.setdefault(where, []).append(entry)
        return parts

    def _part_list(self, client: Client, parts: dict[str, list[dict[str, Any]]]) -> list[Part]:
        nodes = self.nodes
        out: list[Part] = []
        for where, entries in parts.items():
            if where == LOCAL:
                out.append(LocalPart(self._r, client.conn, entries))
            elif nodes is not None:
                out.append(PeerPart(nodes.send, self._loop, where, entries))
        return out

    def _one_shard(self, client: Client, req: object, shard: int, reply: Reply) -> None:
        self._r.learn("PUSHF", shard, reply)
        answer(client, req, reply)

    # -- UpdateParent ---------------------------------------------------------------------

    def update_parent(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        """Forwarded to the child's shard once some shard shows the parent."""
        forward = self._forward
        parent = frame.get("parentId")
        if not isinstance(parent, str) or not parent:
            forward(client, req, "UpdateParent", frame)  # the engine words it
            return

        def found(here: bool, reply: Reply) -> None:
            if here:
                forward(client, req, "UpdateParent", frame)
            elif _unavailable(reply):
                answer(client, req, reply)  # a restarting shard may hold it: not a "no"
            else:
                answer(client, req, {"ok": False, "error": f"Parent job not found: {parent}"})

        probe = {"cmd": "GetState", "id": parent}
        ask_anywhere(self._r, "GetState", probe, found)

    def check_parents(self, client: Client, req: object, name: str, frame: dict[str, Any]) -> bool:
        """False when the PUSH or PUSHB names no parent to check and no children to watch
        for (it goes on at once); else True: it is refused, or sent on once every parent it
        names is found, its reply telling `orphans` of the parents it admitted."""
        links, parents = _flow_refs(name, frame)
        if self.orphans.grace_ms <= 0:
            parents = []
        if not links and not parents:
            return False
        if parents:
            client = _Watching(client, self.orphans, name, frame, parents)
        if links:
            _ParentCheck(self._r, self._forward, client, req, name, frame, links).start()
        else:
            self._forward(client, req, name, frame)
        return True

    # -- RemoveUnprocessedChildren --------------------------------------------------------

    def remove_unprocessed(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        """The parent's shard removes the children it holds; those it does not are cancelled
        on their shards (if still queued) and the parent is told to stop waiting for them."""
        r = self._r
        parent = frame.get("id")

        def done(found: int | None, reply: Reply) -> None:
            name = "RemoveUnprocessedChildren"
            if found is not None and not is_found(name, reply):
                found = None
            peers = r.peers  # several nodes: the parent may be another node's
            if (
                found is None
                and peers
                and peers(client, name, frame, reply, partial(answer, client, req))
            ):
                return
            elsewhere = reply.pop("elsewhere", None)
            if found is None or not isinstance(elsewhere, list):
                answer(client, req, reply)
                return
            r.cache.learn([parent], found)
            _Cascade(self, client, req, str(parent), found, elsewhere).start()

        shard = r.cache.get(parent)
        if shard is not None or r.shards == 1:
            owner = shard if shard is not None else 0
            r.ask(owner, client.conn, frame, partial(done, owner))
        else:
            r.ask_first(client.conn, "RemoveUnprocessedChildren", frame, done)


class _ParentCheck:
    """Asks each named parent's shard for its state; refuses at the first one not found."""

    def __init__(
        self,
        router: Router,
        forward: Forward,
        client: Client,
        req: object,
        name: str,
        frame: dict[str, Any],
        links: dict[str, str],
    ) -> None:
        self._r, self._forward, self._client, self._req = router, forward, client, req
        self._name, self._frame, self._links = name, frame, links
        self._left = len(links)
        self._done = False

    def start(self) -> None:
        r = self._r
        for parent, queue in self._links.items():
            probe = {"cmd": "GetState", "id": parent}
            r.ask(shard_of(queue, r.shards), _INTERNAL_CONN, probe, partial(self._got, parent))

    def _got(self, parent: str, reply: Reply, *, asked_peers: bool = False) -> None:
        if self._done:
            return
        peers = self._r.peers
        if not asked_peers and not is_found("GetState", reply) and peers is not None:
            # Several nodes: the parent's queue may be another node's.
            probe = {"cmd": "GetState", "id": parent}
            again = partial(self._got, parent, asked_peers=True)
            if peers(INTERNAL, "GetState", probe, reply, again):
                return
        if not is_found("GetState", reply) or _unavailable(reply):
            self._done = True
            missing = {"ok": False, "error": f"Parent job not found: {parent}"}
            answer(self._client, self._req, reply if _unavailable(reply) else missing)
            return
        self._left -= 1
        if self._left == 0:
            self._done = True
            self._forward(self._client, self._req, self._name, self._frame)


class _Watching(StandIn):
    """The client of a PUSH or PUSHB that makes parents: its ok reply names them to watch."""

    __slots__ = ("_frame", "_name", "_orphans", "_parents")

    def __init__(
        self,
        client: Client,
        orphans: OrphanWatch,
        name: str,
        frame: Mapping[str, Any],
        parents: list[int],
    ) -> None:
        super().__init__(client)
        self._orphans = orphans
        self._name, self._frame, self._parents = name, frame, parents

    def send(self, reply: Reply) -> None:
        queue = self._frame.get("queue")
        if reply.get("ok") is True and isinstance(queue, str):
            ids = [reply.get("id")] if self._name == "PUSH" else reply.get("ids")
            for index in self._parents:
                if isinstance(ids, list) and index < len(ids) and isinstance(ids[index], str):
                    self._orphans.watch(ids[index], queue)
        self._client.send(reply)


def _flow_refs(name: str, frame: Mapping[str, Any]) -> tuple[dict[str, str], list[int]]:
    """In one pass over a PUSH or PUSHB: the parents its entries name with their queue ({id:
    queue}, as the engine routes the child's notices, `shardq.core._flows.parent_queue_of`),
    and the indices of its entries that name children to wait for (a PUSH is entry 0)."""
    if name == "PUSH":
        entries: list[Any] | tuple[Any, ...] = (frame,)
    else:
        jobs = frame.get("jobs")
        entries = jobs if isinstance(jobs, list) else ()
    links: dict[str, str] = {}
    parents: list[int] = []
    for index, entry in enumerate(entries):
        # A dict, not any Mapping: decoded frames are dicts, and an ABC check per entry of
        # every PUSHB would cost more than the rest of this loop.
        if not isinstance(entry, dict):
            continue
        if entry.get("childrenIds"):
            parents.append(index)
        if "parentId" not in entry:
            continue
        parent = entry["parentId"]
        if not isinstance(parent, str) or not parent or parent == PENDING_PARENT:
            continue
        queue = entry.get("parentQueue")
        data = entry.get("data")
        if not isinstance(queue, str) and isinstance(data, dict):
            queue = data.get("__parentQueue")
        if isinstance(queue, str) and queue:
            links.setdefault(parent, queue)
    return links, parents


class _Cascade:
    """Cancels a parent's children on other shards, then tells the parent, then answers."""

    def __init__(
        self,
        routes: FlowRoutes,
        client: Client,
        req: object,
        parent: str,
        parent_shard: int,
        children: list[Any],
    ) -> None:
        self._r = routes._r
        self._client, self._req = client, req
        self._parent, self._parent_shard = parent, parent_shard
        self._children = [c for c in children if isinstance(c, str)]
        self._left = len(self._children)

    def start(self) -> None:
        if not self._children:
            answer(self._client, self._req, {"ok": True})
        for child in self._children:
            cancel = {"cmd": "Cancel", "id": child}
            ask_anywhere(self._r, "Cancel", cancel, partial(self._cancelled, child))

    def _cancelled(self, child: str, found: bool, reply: Reply) -> None:
        if found and reply.get("ok"):
            self._remove(child)
        elif not found and not _unavailable(reply):
            # Cancel's "not found" also means "not cancellable" (running): ask for its state.
            probe = {"cmd": "GetState", "id": child}
            ask_anywhere(self._r, "GetState", probe, partial(self._probed, child))
        else:
            self._one_done({"ok": True})  # running, finished, or its shard restarting

    def _probed(self, child: str, found: bool, reply: Reply) -> None:
        # No shard or node holds it, and none was restarting: a child that never existed, so
        # the parent stops waiting for it, or it would wait for ever. (A child removed once
        # finished is not found either: its notice, still in flight, then counts only if it
        # arrives first; docs/protocol.md §20.5.)
        if not found and not _unavailable(reply):
            self._remove(child)
        else:
            self._one_done({"ok": True})  # it reports by itself

    def _remove(self, child: str) -> None:
        notice = {"parent": self._parent, "child": child, "kind": "failed", "policy": "remove"}
        cmd = {"cmd": FLOW_NOTIFY, "items": [notice]}
        self._r.ask(self._parent_shard, _INTERNAL_CONN, cmd, self._one_done)

    def _one_done(self, _reply: Reply) -> None:
        self._left -= 1
        if self._left == 0:
            answer(self._client, self._req, {"ok": True})


def _whole_graph_error(entries: object) -> str | None:
    if not isinstance(entries, list):
        return None  # malformed: the shard says why
    nodes = [
        (e["id"], e["input"])
        for e in entries
        if isinstance(e, Mapping)
        and isinstance(e.get("id"), str)
        and isinstance(e.get("input"), Mapping)
    ]
    if len(nodes) < len(entries):
        return graph_error(nodes)  # a malformed node: the shard names it
    return graph_error(nodes) or flow_reference_error(nodes)


def _well_formed(entries: object) -> bool:
    """Whether every node of a PUSHF names its id and queue (else any shard says why)."""
    return (
        isinstance(entries, list)
        and bool(entries)
        and all(
            isinstance(e, Mapping)
            and isinstance(e.get("queue"), str)
            and isinstance(e.get("id"), str)
            for e in entries
        )
    )
