"""Job events: SubscribeEvents, UnsubscribeEvents and TrimEvents, and the fan-out to subscribers.

Shards build events only for queues someone listens to (`shard/_events.py`); this hub tells them
which (`{"t": "listen", "all", "queues"}`, to every shard whenever the set changes and to a shard
that comes back), numbers every event that arrives with a monotonic id, keeps the most recent
`events_ring_size` of them for resumption, and writes each to the connections subscribed to its
queue as bunqueue does: `{type: "event", event, id}` with no `reqId` (docs/protocol.md §18).

A subscriber that does not read loses events, counted, once `events_subscriber_buffer_bytes`
wait unread for it: the hub never buffers for it and never waits for it. In-process listeners
(`add_listener`: tests) get every event of this node's shards, with its id.

Several nodes (docs/cluster.md "Events on several nodes"): the events of other nodes' queues
come relayed (`on_events(..., relayed=True)`, from `_event_relay.EventRelay`, which subscribes
on every peer for what this node's clients want: `on_want`). A `local` subscription (a peer
node's link, which says so with `local: true` and is marked by `NoForward {node}`, or the HTTP
process's webhooks, which deliver per node) gets this node's own events only, and never makes
this node subscribe on its peers: no event goes round in a loop. A peer's link may leave
`events_peer_buffer_bytes` unread (`[cluster]`) instead of a client's bound.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog
from msgpack import packb  # type: ignore[import-untyped]

from shardq.core._options import validate_queue_name as check_queue_name
from shardq.runtime import _messages as msgs
from shardq.runtime._sections import ClusterSettings, EventSettings
from shardq.runtime._spec import ChildSpec
from shardq.runtime.frontend._forward import PEER

__all__ = ["EventHub", "EventLimits", "EventSink"]

Reply = dict[str, Any]
Event = dict[str, Any]
Listener = Callable[[int, Event], None]
# What this node's non-local subscribers want of the other nodes: (every queue, the queues).
Want = tuple[bool, tuple[str, ...]]
NOTHING: Final[Want] = (False, ())
# A `queues` list longer than this is asked of the peers as `all` (the schema's list bound).
MAX_WANTED_QUEUES: Final = 10_000

_log = structlog.get_logger()

# The first id of a front end's lifetime: microseconds since the epoch at its start, so the
# ids of a restarted front end stay above those of the one before (a resuming SSE client's
# Last-Event-ID then never names an event of the new one by accident).
_MICROS: Final = 1_000_000


class EventSink(Protocol):
    """A connection that can take server-initiated frames (TCP and ZeroMQ clients)."""

    conn: str

    def push_event(self, msg: dict[str, Any], frames: dict[str, bytes], limit: int) -> bool:
        """Queue one event frame; False when it was dropped (the peer is not reading)."""


_EVENTS = EventSettings()  # the defaults, declared once in `_sections.py`
_CLUSTER = ClusterSettings()


@dataclass(frozen=True, slots=True)
class EventLimits:
    """The front end's events settings under its own names; `EventSettings` documents each
    and holds its default."""

    ring_size: int = _EVENTS.events_ring_size
    ring_data_bytes: int = _EVENTS.events_ring_data_bytes
    buffer_bytes: int = _EVENTS.events_subscriber_buffer_bytes
    peer_buffer_bytes: int = _CLUSTER.events_peer_buffer_bytes

    @classmethod
    def from_spec(cls, spec: ChildSpec) -> EventLimits:
        return cls(
            spec.events.events_ring_size,
            spec.events.events_ring_data_bytes,
            spec.events.events_subscriber_buffer_bytes,
            spec.cluster.events_peer_buffer_bytes,
        )


@dataclass(slots=True)
class _Subscriber:
    sink: EventSink
    queues: frozenset[str] | None  # None: every queue (shardq's `all: true`)
    local: bool = False  # this node's own events only (a peer's link, webhooks)
    limit: int = 0  # unread bytes it may leave
    dropped: int = 0

    def wants(self, event: Event, relayed: bool) -> bool:
        return (self.queues is None or event["queue"] in self.queues) and not (
            relayed and self.local
        )


class EventHub:
    """Subscriptions, the ring of recent events, and the fan-out."""

    def __init__(
        self,
        shards: int,
        control: Callable[[int, Mapping[str, Any]], None],
        answer: Callable[[Any, object, Reply], None],
        limits: EventLimits = EventLimits(),
    ) -> None:
        ring_size = limits.ring_size
        self._shards = shards
        self._control = control
        self._answer = answer
        # (id, event, relayed from another node)
        self.ring: deque[tuple[int, Event, bool]] = (
            deque(maxlen=ring_size) if ring_size else deque(maxlen=0)
        )
        self.buffer_bytes = limits.buffer_bytes  # also bounds the cancels pushed to workers
        self._peer_buffer_bytes = limits.peer_buffer_bytes
        self._ring_data_bytes = limits.ring_data_bytes
        self._ids = itertools.count(int(time.time() * _MICROS))
        self.last_id = 0
        self.subscribers: dict[str, _Subscriber] = {}
        self._listeners: list[Listener] = []
        self._listening: tuple[bool, tuple[str, ...]] = (False, ())
        self.dropped = 0  # events not written to a subscriber that was not reading
        # Told what this node's clients want of the other nodes' events (`EventRelay`).
        self.on_want: Callable[[Want], None] | None = None
        self.want: Want = NOTHING
        self.handlers: dict[str, Callable[[Any, object, dict[str, Any]], None]] = {
            "SubscribeEvents": self._subscribe,
            "UnsubscribeEvents": self._unsubscribe,
            "TrimEvents": self._trim,
        }

    # -- commands --------------------------------------------------------------------------

    def _subscribe(self, client: Any, req: object, frame: dict[str, Any]) -> None:
        queues, error = _queues_of(frame)
        if error is not None:
            self._answer(client, req, {"ok": False, "error": error})
            return
        if not hasattr(client, "push_event"):
            self._answer(client, req, {"ok": False, "error": "Events need a TCP or ZeroMQ client"})
            return
        peer = getattr(client, "no_forward", None) == PEER
        # One subscription per connection, as bunqueue: a new one replaces the old one.
        sub = _Subscriber(
            client,
            queues,
            local=peer or frame.get("local") is True,
            limit=self._peer_buffer_bytes if peer else self.buffer_bytes,
        )
        self.subscribers[client.conn] = sub
        reply: Reply = {"ok": True}
        since = frame.get("since")
        if isinstance(since, float) and since.is_integer():
            # An event id beyond 32 bits reaches TCP clients as a float (protocol §21.5),
            # and JS clients send it back as one.
            since = int(since)
        replay: list[tuple[int, Event]] = []
        if isinstance(since, int) and not isinstance(since, bool):
            replay, gap = self._since(since, sub)
            reply["lastEventId"] = self.last_id
            reply["gap"] = gap
        self._answer(client, req, reply)
        for event_id, event in replay:
            self._deliver(sub, event_id, event, {})
        self._update_listen()

    def _since(self, since: int, sub: _Subscriber) -> tuple[list[tuple[int, Event]], bool]:
        """The ring's events after `since` for `sub`, and whether some may be missing (the
        id is older than the oldest the ring still holds)."""
        oldest = self.ring[0][0] if self.ring else self.last_id + 1
        gap = since + 1 < oldest and since < self.last_id
        return [(i, e) for i, e, relayed in self.ring if i > since and sub.wants(e, relayed)], gap

    def _unsubscribe(self, client: Any, req: object, frame: dict[str, Any]) -> None:
        self.subscribers.pop(client.conn, None)
        self._answer(client, req, {"ok": True})
        self._update_listen()

    def _trim(self, client: Any, req: object, frame: dict[str, Any]) -> None:
        queue = frame.get("queue")
        error = check_queue_name(queue)
        keep = frame.get("maxLength")
        if error is None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
            error = "maxLength must be a non-negative integer"
        if error is not None:
            self._answer(client, req, {"ok": False, "error": error})
            return
        removed = self.trim(str(queue), int(keep or 0))
        self._answer(client, req, {"ok": True, "data": {"removed": removed}})

    def trim(self, queue: str, keep: int) -> int:
        """Drop the ring's events of `queue` but its newest `keep`; return how many went."""
        held = sum(1 for _, e, _r in self.ring if e["queue"] == queue)
        remove = max(held - keep, 0)
        if remove:
            left = remove
            kept: list[tuple[int, Event, bool]] = []
            for item in self.ring:
                if left and item[1]["queue"] == queue:
                    left -= 1
                    continue
                kept.append(item)
            self.ring.clear()
            self.ring.extend(kept)
        return remove

    # -- connections and shards ------------------------------------------------------------

    def forget(self, conn: str) -> None:
        """The connection closed."""
        if self.subscribers.pop(conn, None) is not None:
            self._update_listen()

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(id, event)` for every event of every queue; returns the remover."""
        self._listeners.append(listener)
        self._update_listen()

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
                self._update_listen()

        return remove

    def shard_up(self, shard: int) -> None:
        """A shard (re)connected: a new shard knows nothing of who listens, and after a
        restart of this front end a shard still follows the last one's subscribers."""
        every, queues = self._listening
        self._control(shard, msgs.listen(every, list(queues)))

    def _update_listen(self) -> None:
        subs = list(self.subscribers.values())
        want = _wanted([s for s in subs if not s.local])
        if want != self.want:
            self.want = want
            if self.on_want is not None:
                self.on_want(want)
        every, queues = _wanted(subs)
        every = every or bool(self._listeners)
        queues = () if every else queues
        if (every, queues) == self._listening:
            return
        self._listening = (every, queues)
        msg = msgs.listen(every, list(queues))
        for shard in range(self._shards):
            self._control(shard, msg)

    # -- events in, frames out -------------------------------------------------------------

    def on_events(self, items: object, relayed: bool = False) -> None:
        """A shard's `events` message, or (`relayed`) events of another node's queues. Never
        raises for a malformed item."""
        for event in items if isinstance(items, list) else ():
            if not (isinstance(event, dict) and isinstance(event.get("queue"), str)):
                continue
            event_id = next(self._ids)
            self.last_id = event_id
            self.ring.append((event_id, self._ring_copy(event), relayed))
            frames: dict[str, bytes] = {}
            for sub in self.subscribers.values():
                if sub.wants(event, relayed):
                    self._deliver(sub, event_id, event, frames)
            if relayed:
                continue  # the listeners (webhooks, tests) are this node's
            for listener in self._listeners:
                try:
                    listener(event_id, event)
                except Exception:
                    _log.exception("event listener failed")

    def _ring_copy(self, event: Event) -> Event:
        """What the ring keeps of an event: a large `data` would make the ring's memory a
        multiple of the results' sizes, so it is left out (`truncated: true`)."""
        data = event.get("data")
        if data is None or isinstance(data, int | float | bool):
            return event
        try:
            size = len(packb(data, use_bin_type=True))
        except (TypeError, ValueError, OverflowError):
            size = self._ring_data_bytes + 1
        if size <= self._ring_data_bytes:
            return event
        return {**{k: v for k, v in event.items() if k != "data"}, "truncated": True}

    def _deliver(
        self, sub: _Subscriber, event_id: int, event: Event, frames: dict[str, bytes]
    ) -> None:
        msg = {"type": "event", "event": event, "id": event_id}
        if not sub.sink.push_event(msg, frames, sub.limit):
            sub.dropped += 1
            self.dropped += 1
            if sub.dropped == 1 or sub.dropped % 10_000 == 0:
                _log.warning("events dropped for a slow subscriber", conn=sub.sink.conn,
                             dropped=sub.dropped)  # fmt: skip


def _queues_of(frame: dict[str, Any]) -> tuple[frozenset[str] | None, str | None]:
    """A subscription's queues (None: all) or the error: `all: true`, `queues` (shardq: a
    list, what a node asks of its peers) or `queue`."""
    if frame.get("all") is True:
        return None, None
    names = frame.get("queues")
    if names is None:
        names = [frame.get("queue")]
    elif not isinstance(names, list) or not names:
        return None, "queues must be a non-empty list of queue names"
    for name in names:
        error = check_queue_name(name)
        if error is not None:
            return None, error
    return frozenset(str(n) for n in names), None


def _wanted(subs: list[_Subscriber]) -> Want:
    """What `subs` listen to together: every queue, or these."""
    if not subs:
        return NOTHING
    if any(s.queues is None for s in subs):
        return (True, ())
    queues: set[str] = set()
    for sub in subs:
        queues.update(sub.queues or ())
    return (False, tuple(sorted(queues)))
