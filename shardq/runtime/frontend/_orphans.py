"""Parents waiting for children that were never pushed (docs/protocol.md §20.5).

A PUSH may name children that do not exist yet: bunqueue-client 0.1.5 pushes them first, but
a client may push the parent first and its children after, on any shard. So a parent is not
refused at its push. Instead the front end remembers each admitted parent (`watch`), and once
`flow_children_grace_ms` has passed it looks once:

1. the parent's shard answers GetJob: a parent no longer in `waiting-children`, or gone, is
   done with;
2. every shard answers `FlowHeld` for the children the parent still waits for (`flowPending`),
   one request per shard;
3. each child that no shard holds (or saw complete) is sent to the parent as a failed child
   with `failParentOnFailure`'s effect (the first 5,000 of them): the parent fails, to its
   DLQ, with `failedReason` `child X failed: Child job not found: X`.

If a shard could not answer (restarting), the parent is looked at again one grace later. What
is remembered is bounded by `flow_children_watch_max` parents (their ids and queue); past it
a new parent is not watched (logged). The memory is the front end's: a restart of it forgets
the parents it was watching.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import structlog

from shardq.core import FLOW_HELD, FLOW_NOTIFY
from shardq.runtime._routing import shard_of
from shardq.runtime._sections import FrontendSettings
from shardq.runtime.frontend._merge import SHARD_UNAVAILABLE

if TYPE_CHECKING:
    import asyncio

    from shardq.runtime.frontend._flow_nodes import NodeMap
    from shardq.runtime.frontend._replies import Reply
    from shardq.runtime.frontend._router import Router

__all__ = ["OrphanWatch"]

_log = structlog.get_logger()
_DEFAULTS: Final = FrontendSettings()
_CONN: Final = "flows"  # the front end's own requests (as `_flows`)
_PER_TICK: Final = 100  # parents looked at per timer turn: a burst is spread over turns
# Ids per FlowHeld request, and failure notices per parent: well inside the schema's list
# limit (10,000 by default), whatever the number of children a parent waits for.
_CHUNK: Final = 5_000


def _unavailable(reply: Reply) -> bool:
    return str(reply.get("error", "")).startswith(SHARD_UNAVAILABLE)


class OrphanWatch:
    def __init__(self, router: Router, loop: asyncio.AbstractEventLoop) -> None:
        self._r = router
        self._loop = loop
        # The configured ones are set by the process (`frontend` section).
        self.grace_ms = _DEFAULTS.flow_children_grace_ms
        self.max_watched = _DEFAULTS.flow_children_watch_max
        # Several nodes (`FlowRoutes.span_nodes`): the children may be on the others.
        self.nodes: NodeMap | None = None
        self._due: deque[tuple[float, str, str]] = deque()  # (loop time s, parent, queue)
        self._timer: asyncio.TimerHandle | None = None
        self._warned = False

    def __len__(self) -> int:
        return len(self._due)

    def watch(self, parent: str, queue: str) -> None:
        """`parent` (on `queue`) was admitted waiting for children: look at it after grace."""
        if self.grace_ms <= 0:
            return
        if len(self._due) >= self.max_watched:
            if not self._warned:
                _log.warning("flow parents not watched: flow_children_watch_max reached",
                             limit=self.max_watched)  # fmt: skip
                self._warned = True
            return
        self._due.append((self._loop.time() + self.grace_ms / 1000, parent, queue))
        self._arm()

    def _arm(self) -> None:
        if self._timer is None and self._due:
            delay = max(0.0, self._due[0][0] - self._loop.time())
            self._timer = self._loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = self._loop.time()
        for _ in range(_PER_TICK):
            if not self._due or self._due[0][0] > now:
                break
            _, parent, queue = self._due.popleft()
            _Look(self, parent, queue).start()
        if len(self._due) < self.max_watched:
            self._warned = False
        self._arm()


class _Look:
    """One parent's look: its pending children, who holds them, and the notice for the rest."""

    def __init__(self, watch: OrphanWatch, parent: str, queue: str) -> None:
        self._watch, self._r = watch, watch._r
        self._parent, self._queue = parent, queue
        self._shard = shard_of(queue, self._r.shards)
        self._pending: list[str] = []
        self._held: set[str] = set()
        self._left = 0
        self._retry = False

    def start(self) -> None:
        cmd = {"cmd": "GetJob", "id": self._parent}
        self._r.ask(self._shard, _CONN, cmd, self._got_parent)

    def _got_parent(self, reply: Reply) -> None:
        if _unavailable(reply):
            self._watch.watch(self._parent, self._queue)
            return
        job = reply.get("job")
        if not isinstance(job, dict) or job.get("state") != "waiting-children":
            return  # released, running, finished or gone: nothing waits for ever
        pending = job.get("flowPending")
        listed = pending if isinstance(pending, list) else []
        self._pending = [c for c in listed if isinstance(c, str)]
        if not self._pending:
            return
        chunks = [self._pending[i : i + _CHUNK] for i in range(0, len(self._pending), _CHUNK)]
        self._left = (self._r.shards + 1) * len(chunks)
        for chunk in chunks:
            for shard in range(self._r.shards):
                cmd = {"cmd": FLOW_HELD, "ids": chunk}
                self._r.ask(shard, _CONN, cmd, self._got_held)
            nodes = self._watch.nodes
            peer_cmd = {"cmd": "PeerFlowHeld", "ids": chunk}
            if nodes is None or not nodes.gather_peers(peer_cmd, self._got_peers):
                self._left -= 1  # a node alone: its shards are all there is

    def _got_peers(self, replies: list[Reply]) -> None:
        """The other nodes' answers for one chunk, as one."""
        held: list[str] = []
        for reply in replies:
            if reply.get("ok") is not True:
                self._got_held(reply)  # a node that cannot say may hold them: look again
                return
            held.extend(h for h in reply.get("held") or () if isinstance(h, str))
        self._got_held({"ok": True, "held": held})

    def _got_held(self, reply: Reply) -> None:
        held = reply.get("held")
        if reply.get("ok") is not True:
            self._retry = True  # a shard that cannot say may hold them
        elif isinstance(held, list):
            self._held.update(h for h in held if isinstance(h, str))
        self._left -= 1
        if self._left:
            return
        if self._retry:
            self._watch.watch(self._parent, self._queue)
            return
        missing = [c for c in self._pending if c not in self._held]
        if not missing:
            return
        items = [
            {"parent": self._parent, "child": c, "kind": "failed", "policy": "fail",
             "reason": f"Child job not found: {c}"}
            for c in missing[:_CHUNK]  # the first fails the parent; the rest are a record
        ]  # fmt: skip
        _log.info("flow parent failed: children never pushed", parent=self._parent,
                  missing=len(missing))  # fmt: skip
        cmd = {"cmd": FLOW_NOTIFY, "items": items}
        self._r.ask(self._shard, _CONN, cmd, partial(_ignore, self._parent))


def _ignore(_parent: str, _reply: Any) -> None:
    """The notice's reply: a parent gone meanwhile is fine."""
