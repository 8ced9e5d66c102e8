"""Who a reply goes to: the dispatcher's view of a client, and the collectors that gather
the replies of a command sent to several shards before its client is answered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

from shardq.protocol._rawpush import RAW_REFUSED
from shardq.runtime.frontend._limits import ParkedSlots
from shardq.runtime.frontend._merge import SHARD_UNAVAILABLE, is_found

__all__ = [
    "NO_REQ_ID",
    "Client",
    "FirstFound",
    "Gather",
    "OnReply",
    "ParkedClient",
    "RawReply",
    "Reply",
    "StandIn",
    "answer",
]

Reply = dict[str, Any]
OnReply = Callable[[Reply], None]
# The frame had no reqId: the reply carries none either.
NO_REQ_ID: Final = object()


class Client(Protocol):
    """One client connection as the dispatcher sees it."""

    conn: str
    authenticated: bool

    def send(self, reply: Reply) -> None:
        """Queue one reply frame for the client (dropped if the connection is gone)."""

    def drop(self, reason: str) -> None:
        """Close the connection after what is queued, for protocol abuse; `reason` is logged."""


def answer(client: Client, req: object, reply: Reply) -> None:
    """Send `reply` to `client` with the request's `reqId` echoed verbatim, if it had one."""
    if req is not NO_REQ_ID:
        reply["reqId"] = req
    client.send(reply)


class RawReply:
    """The reply of a PUSHB passed to its shard as bytes (`Router.route_raw`): learned and
    sent as `_Direct` sends a PUSHB's; one the shard marks `RAW_REFUSED` (it did not take
    the body, and changed nothing) goes to `refused` instead."""

    __slots__ = ("client", "learn", "refused", "req")

    def __init__(
        self, learn: OnReply, client: Client, req: object, refused: Callable[[], None]
    ) -> None:
        self.learn = learn
        self.client = client
        self.req = req
        self.refused = refused

    def __call__(self, reply: Reply) -> None:
        if RAW_REFUSED in reply:
            self.refused()
            return
        self.learn(reply)
        answer(self.client, self.req, reply)


class FirstFound:
    """Collects one id command's replies from every shard; the first that shows the job wins.

    When no shard shows the job, the first reply (a "not found") answers once all are in.
    """

    __slots__ = ("_done", "_first", "_left", "_name", "_on_done", "_unavailable")

    def __init__(self, n: int, name: str, on_done: Callable[[int | None, Reply], None]) -> None:
        self._left = n
        self._name = name
        self._on_done = on_done
        self._first: Reply | None = None
        # A restarting shard may hold the job: "not found" would then be a lie.
        self._unavailable: Reply | None = None
        self._done = False

    def part(self, shard: int, reply: Reply) -> None:
        self._left -= 1
        if self._done:
            return
        if is_found(self._name, reply):
            self._done = True
            self._on_done(shard, reply)
            return
        if str(reply.get("error", "")).startswith(SHARD_UNAVAILABLE):
            self._unavailable = self._unavailable or reply
        elif self._first is None:
            self._first = reply
        if self._left == 0:
            self._done = True
            self._on_done(None, self._unavailable or self._first or reply)


class Gather:
    """Collects one reply per part, then hands them over in part order."""

    __slots__ = ("_left", "_on_done", "_replies")

    def __init__(self, n: int, on_done: Callable[[list[Reply]], None]) -> None:
        self._replies: list[Reply] = [{} for _ in range(n)]
        self._left = n
        self._on_done = on_done

    def part(self, index: int, reply: Reply) -> None:
        self._replies[index] = reply
        self._left -= 1
        if self._left == 0:
            self._on_done(self._replies)


class StandIn:
    """A `Client` that stands in for a connection's own while one command is on its way (to
    count its reply, free a slot, watch for parents, route a wait again): it is that
    connection in every way but `send`, which a subclass overrides and which ends by passing
    the reply on."""

    __slots__ = ("_client", "conn")

    def __init__(self, client: Client) -> None:
        self._client = client
        self.conn: str = client.conn

    @property
    def authenticated(self) -> bool:
        return bool(self._client.authenticated)

    @authenticated.setter
    def authenticated(self, value: bool) -> None:
        self._client.authenticated = value

    @property
    def no_forward(self) -> int:
        # What the connection asked with `NoForward` (frontend._forward): a stand-in must say
        # it too, or a peer node's request would be forwarded or fanned out again (a loop).
        return int(getattr(self._client, "no_forward", 0))

    def send(self, reply: Reply) -> None:
        self._client.send(reply)

    def drop(self, reason: str) -> None:
        self._client.drop(reason)


class ParkedClient(StandIn):
    """The dispatcher's `Client` for one parked long-poll: frees its slot, then forwards."""

    __slots__ = ("_slots",)

    def __init__(self, slots: ParkedSlots, client: Client) -> None:
        super().__init__(client)
        self._slots = slots

    def send(self, reply: Reply) -> None:
        self._slots.give_back(self.conn)
        self._client.send(reply)
