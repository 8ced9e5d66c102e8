"""Events of the other nodes' queues, for this node's subscribers (docs/cluster.md).

Several nodes on one database: a shard builds events only for the queues its node holds, so a
client subscribed on node A would see nothing of a queue node B holds. `EventRelay` subscribes
on every other live node for what this node's clients want (the `EventHub` says so through
`on_want`: every queue, or a set of them) and hands the events that come back to the hub,
which numbers them with its own ids and writes them to its subscribers like its shards' own.

Each peer gets a link of its own (a `PeerLink`, as forwarding uses, but not the forwards'
one: a burst of events must not delay forwarded replies, nor a large reply cost events). It
starts with `NoForward {node}` like every peer link, then sends `SubscribeEvents {local:
true}` with `all: true` or `queues: [...]`. The peer delivers only the events of its own
queues on it (never events it relayed itself: no loops) and bounds what the link leaves
unread by `events_peer_buffer_bytes`, dropping events past it as for any slow subscriber;
this node reads the link as it comes and writes each event to its own subscribers within
their own bound, so nothing buffers without bound on either side.

`sync` runs whenever what the clients want changes and at each re-read of the cluster map
(a tenth of a lease): a peer that appeared is subscribed on, one that left is closed, a link
that broke is opened again and subscribed with `since` set to the last event id seen from
that peer, so the peer replays what its ring still holds of the gap. So a subscription goes
on receiving across a takeover: the partitions of a node that stops pass to this node (its
shards listen already) or to another one (subscribed on already).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import structlog

from shardq.runtime.frontend._events import MAX_WANTED_QUEUES, NOTHING, Event, Want
from shardq.runtime.frontend._forward import ForwardLimits, PeerLink
from shardq.runtime.frontend._replies import Reply

__all__ = ["EventRelay"]

_log = structlog.get_logger()


class _PeerEvents:
    """The event subscription on one peer: what it acknowledged, on which connection."""

    def __init__(
        self,
        address: str,
        loop: asyncio.AbstractEventLoop,
        limits: ForwardLimits,
        deliver: Callable[[list[Event]], None],
    ) -> None:
        self.link = PeerLink(address, loop, limits, on_push=self._pushed)
        self._deliver = deliver
        self._acked: Want | None = None  # what the peer acknowledged ...
        self._acked_on = 0  # ... on this connection of the link
        self._asking = False
        self._failed = False
        self.last_id: int | None = None  # the peer's id of the last event it sent
        self.received = 0

    def _current(self) -> bool:
        link = self.link
        return link.connected and self._acked_on == link.connections

    def sync(self, want: Want) -> None:
        if self._asking or (self._acked == want and self._current()):
            return
        every, queues = want
        cmd: dict[str, Any] = {"cmd": "SubscribeEvents", "local": True}
        if every or len(queues) > MAX_WANTED_QUEUES:
            cmd["all"] = True
        else:
            cmd["queues"] = list(queues)
        if self._acked is not None and not self._current() and self.last_id is not None:
            cmd["since"] = self.last_id  # a new connection: the peer replays the gap
        self._asking = True
        self.link.send(cmd, partial(self._answered, want))

    def _answered(self, want: Want, reply: Reply) -> None:
        self._asking = False
        if reply.get("ok") is True:
            self._acked, self._acked_on, self._failed = want, self.link.connections, False
            if reply.get("gap") is True:
                _log.warning("events of a peer lost while its link was down",
                             peer=self.link.address)  # fmt: skip
        elif not self._failed:  # logged once until it works again; retried at each sync
            self._failed = True
            _log.warning("cannot subscribe to a peer's events", peer=self.link.address,
                         error=reply.get("error"))  # fmt: skip

    def _pushed(self, frame: Reply) -> None:
        event, event_id = frame.get("event"), frame.get("id")
        if frame.get("type") != "event" or not isinstance(event, dict):
            return
        if isinstance(event_id, int | float) and not isinstance(event_id, bool):
            self.last_id = int(event_id)  # beyond 32 bits it may come as a float
        self.received += 1
        self._deliver([event])

    def close(self) -> None:
        self.link.close()


class EventRelay:
    """This node's event subscriptions on its peers (one link each, only while wanted)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        limits: ForwardLimits,
        peers: Callable[[], Sequence[str]],
        deliver: Callable[[list[Event]], None],
    ) -> None:
        self._loop = loop
        self._limits = limits
        self._peers = peers
        self._deliver = deliver
        self.want: Want = NOTHING
        self.links: dict[str, _PeerEvents] = {}

    @property
    def received(self) -> int:
        """Events received from the peers over the links open now."""
        return sum(p.received for p in self.links.values())

    def set_want(self, want: Want) -> None:
        self.want = want
        self.sync()

    def sync(self) -> None:
        """Subscribe on each live peer for what is wanted; close the links not needed."""
        peers = set(self._peers()) if self.want != NOTHING else set()
        for address in [a for a in self.links if a not in peers]:
            self.links.pop(address).close()
        for address in sorted(peers):
            sub = self.links.get(address)
            if sub is None:
                sub = self.links[address] = _PeerEvents(
                    address, self._loop, self._limits, self._deliver
                )
            sub.sync(self.want)

    def close(self) -> None:
        for sub in self.links.values():
            sub.close()
        self.links.clear()
