"""Forwarding: a command for a queue another node holds goes to that node, and its reply back.

Several nodes on one database (docs/cluster.md): the front end's partition guard finds that a
command's queue belongs to a partition another live node holds (it would answer
`MOVED <partition> <host:port>`). Unless the connection asked for `MOVED` (`NoForward`), the
`Forwarder` sends the command to that node instead and relays its reply, so bunqueue's clients
and the HTTP API need nothing new.

The link to a peer is its ordinary TCP port, with bunqueue's framing (u32 length + msgpack)
and request ids: the owner needs no second listener, and its gateway's limits, back-pressure
and `Auth` apply to forwarded requests as to any client's. One connection per peer, opened on
the first forward and again after a loss, pipelined (replies match by `reqId`, in any order).
It starts with `Auth` (the first configured token, when the node wants one) and
`NoForward {node}`, which marks the connection as a peer's: a node never forwards what a peer
forwarded to it (it answers `MOVED`) and never fans a peer's job id out again, so no request
loops.

Bounds, per peer (`[cluster]`): `forward_max_in_flight` requests and `forward_max_bytes`
bytes sent (or waiting for the connection) and not answered; past either a forward answers
`Node busy: ...` at once; bytes written and still unsent past `forward_max_bytes` (a peer that
stopped reading while its requests timed out) drop the link. A forward unanswered after
`forward_timeout_ms` (plus a long-poll's own `timeout`) answers `Node unavailable: ...`, as
does one whose peer cannot be reached (then for a second no new connection is tried: each
forward meanwhile fails at once). A link that breaks fails the requests it carried and is
opened again by the next forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import structlog

from shardq.client._core import ClientCore, Framing
from shardq.client._errors import SerializationError
from shardq.runtime._spec import ChildSpec
from shardq.runtime.frontend._merge import combine_batch, is_found
from shardq.runtime.frontend._replies import Client, Gather, OnReply, Reply, answer
from shardq.runtime.frontend._router import no_count

__all__ = [
    "FORWARD",
    "MOVED",
    "NODE_BUSY",
    "NODE_FIELD",
    "NODE_UNAVAILABLE",
    "PEER",
    "ForwardLimits",
    "Forwarder",
    "PeerLink",
]

NODE_UNAVAILABLE: Final = "Node unavailable"
NODE_BUSY: Final = "Node busy"
NODE_FIELD: Final = "node"  # the peer a reply to `Forwarder.gather_peers` came from
PARTITION_UNAVAILABLE: Final = "Partition unavailable"  # the guard's refusal while one moves
# A connection's `no_forward`: what it asked with `NoForward`.
FORWARD: Final = 0  # a client (the default): forward, fan job ids out to the peers
MOVED: Final = 1  # a client that follows MOVED itself (shardq's own client)
PEER: Final = 2  # another node's link: this node's own queues and jobs only
_RETRY_S: Final = 1.0  # after a failed connect, forwards fail at once this long
_MAX_LINKS: Final = 1024  # peer addresses kept (a cluster has far fewer nodes)

_log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class ForwardLimits:
    """The `[cluster]` forward settings, and what the link says about this node."""

    node: str = ""
    token: str = ""  # sent as `Auth` first when not empty
    max_in_flight: int = 10_000
    max_bytes: int = 64 * 1024 * 1024
    timeout_s: float = 30.0
    gather_timeout_s: float = 5.0  # a peer's answer to a cluster-wide command (gather_peers)

    @classmethod
    def from_spec(cls, spec: ChildSpec) -> ForwardLimits:
        cluster, tokens = spec.cluster, spec.tcp.auth_tokens
        return cls(
            node=cluster.node_id,
            token=tokens[0] if tokens else "",
            max_in_flight=cluster.forward_max_in_flight,
            max_bytes=cluster.forward_max_bytes,
            timeout_s=cluster.forward_timeout_ms / 1000,
            gather_timeout_s=cluster.gather_timeout_ms / 1000,
        )


def no_forward(client: Client, req: object, frame: dict[str, Any]) -> None:
    """`NoForward {node?}`: this connection gets `MOVED` for another node's queue instead of a
    forward; with `node` it is that node's link (its job ids are not fanned out again)."""
    mode = PEER if frame.get("node") else MOVED
    setattr(client, "no_forward", mode)  # noqa: B010 (not part of the Protocol)
    answer(client, req, {"ok": True})


def unavailable(address: str, why: str) -> Reply:
    return {"ok": False, "error": f"{NODE_UNAVAILABLE}: node {address} {why}"}


class _Waiter:
    """One forwarded request: its reply's callback, its bytes, its deadline."""

    __slots__ = ("link", "on_reply", "settled", "size", "timer")

    def __init__(self, link: PeerLink, on_reply: OnReply) -> None:
        self.link = link
        self.on_reply = on_reply
        self.settled = False
        self.size = 0
        self.timer: asyncio.TimerHandle | None = None

    def done(self) -> bool:
        return self.settled

    def set_exception(self, exception: BaseException) -> None:
        self.settle(unavailable(self.link.address, f"lost the link: {exception}"))

    def settle(self, reply: Reply) -> None:
        if self.settled:
            return
        self.settled = True
        if self.timer is not None:
            self.timer.cancel()
        self.link.release(self.size)
        reply.pop("reqId", None)  # the link's id, not the client's
        self.on_reply(reply)


class _Conn(asyncio.Protocol):
    """The socket of one connection of a `PeerLink` (a new one after each loss)."""

    def __init__(self, link: PeerLink) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.link.received(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.lost(self, f"closed the link ({exc})" if exc else "closed the link")


class PeerLink:
    """One pipelined connection to a peer node's TCP port, reopened after a loss."""

    def __init__(self, address: str, loop: asyncio.AbstractEventLoop, limits: ForwardLimits):
        self.address = address
        self._loop = loop
        self._limits = limits
        self._core: ClientCore[_Waiter] = ClientCore(Framing.STREAM)
        self._conn: _Conn | None = None
        self._connecting = False
        self._retry_at = 0.0
        self._why = ""
        self._out: list[bytes] = []  # written at the end of the turn, or once connected
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.in_flight = 0
        self.bytes = 0

    def send(
        self, cmd: Mapping[str, Any], on_reply: OnReply, timeout_s: float | None = None
    ) -> None:
        """Forward `cmd`; `on_reply` gets the peer's reply or an error (never re-entrantly),
        at the latest after `timeout_s` (default `forward_timeout_ms`) plus a long-poll's own."""
        limits = self._limits
        if self.in_flight >= limits.max_in_flight or self.bytes >= limits.max_bytes:
            busy = f"{NODE_BUSY}: {self.in_flight} requests ({self.bytes} bytes) in flight"
            self._loop.call_soon(on_reply, {"ok": False, "error": f"{busy} to {self.address}"})
            return
        if self._conn is None and not self._connecting:
            if self._closed or self._loop.time() < self._retry_at:
                self._loop.call_soon(on_reply, unavailable(self.address, self._why))
                return
            self._open()
        waiter = _Waiter(self, on_reply)
        try:
            rids, payloads = self._core.prepare([cmd], [waiter])
        except SerializationError as e:
            self._loop.call_soon(on_reply, {"ok": False, "error": str(e)})
            return
        waiter.size = len(payloads[0])
        self.in_flight += 1
        self.bytes += waiter.size
        wait = (self._limits.timeout_s if timeout_s is None else timeout_s) + _own_timeout(cmd)
        waiter.timer = self._loop.call_later(wait, self._expire, rids[0], wait)
        self._write(payloads[0])

    def release(self, size: int) -> None:
        self.in_flight -= 1
        self.bytes -= size

    def _write(self, payload: bytes) -> None:
        if not self._out and self._conn is not None:
            self._loop.call_soon(self._flush)
        self._out.append(payload)

    def _flush(self) -> None:
        conn = self._conn
        if conn is None or conn.transport is None or not self._out:
            return
        out, self._out = self._out, []
        conn.transport.write(out[0] if len(out) == 1 else b"".join(out))
        # Requests that timed out free their share of the bound, but their bytes may still be
        # unsent: a peer that stopped reading must not make this buffer grow without bound.
        unsent = conn.transport.get_write_buffer_size()
        if unsent > self._limits.max_bytes:
            self._drop(f"is not reading ({unsent} bytes unsent)")

    def _open(self) -> None:
        self._connecting = True
        self._task = self._loop.create_task(self._connect())  # referenced until it ends

    async def _connect(self) -> None:
        host, _, port = self.address.rpartition(":")
        conn = _Conn(self)
        try:
            async with asyncio.timeout(min(5.0, self._limits.timeout_s)):
                await self._loop.create_connection(lambda: conn, host.strip("[]"), int(port))
        except (OSError, ValueError, TimeoutError) as e:
            self._connecting = False
            self._down(f"cannot be reached ({e!r})")
            return
        self._connecting = False
        if self._closed:
            if conn.transport is not None:
                conn.transport.abort()
            return
        self._conn = conn
        # The peer must read these before the forwards queued behind them.
        hello: list[dict[str, Any]] = []
        if self._limits.token:
            hello.append({"cmd": "Auth", "token": self._limits.token})
        hello.append({"cmd": "NoForward", "node": self._limits.node})
        waiters = [_Waiter(self, self._greeted) for _ in hello]
        _rids, payloads = self._core.prepare(hello, waiters)
        self.in_flight += len(hello)  # released as each is answered
        self._out.insert(0, payloads[0])
        self._flush()

    def _greeted(self, reply: Reply) -> None:
        if reply.get("ok") is not True and self._conn is not None:
            _log.error("peer refused this node's link", peer=self.address, error=reply.get("error"))
            self._drop(f"refused the link: {reply.get('error')}")

    def received(self, conn: _Conn, data: bytes) -> None:
        if conn is not self._conn:
            return
        for waiter, reply in self._core.feed(data):
            waiter.settle(reply)
        if self._core.broken is not None:
            self._drop(self._core.broken)

    def lost(self, conn: _Conn, why: str) -> None:
        if conn is self._conn:
            self._conn = None
            self._down(why, backoff=False)  # the next forward reconnects at once

    def _drop(self, why: str) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.transport.abort()
        self._down(why)

    def _down(self, why: str, *, backoff: bool = True) -> None:
        """Fail every request sent or queued; with `backoff` new forwards fail at once for
        a while (the peer could not be reached, or refused the link)."""
        self._why = why
        self._retry_at = self._loop.time() + _RETRY_S if backoff else 0.0
        self._out = []
        waiting = self._core.fail_all()
        self._core = ClientCore(Framing.STREAM)
        if waiting:
            _log.warning("peer link down", peer=self.address, requests=len(waiting), why=why)
        for waiter in waiting:
            waiter.settle(unavailable(self.address, why))

    def _expire(self, rid: str, wait: float) -> None:
        for waiter in self._core.take([rid]):
            waiter.settle(unavailable(self.address, f"did not answer within {wait:g} s"))

    def close(self) -> None:
        self._closed = True
        self._drop("is not linked any more: this node is stopping")


def _relay(client: Client, req: object, address: str, reply: Reply) -> None:
    """A forward's reply to its client. A `MOVED` from the holder means the two nodes' maps
    disagree for a moment (a partition changing hands): the client, which did not ask for
    `MOVED`, gets the retryable refusal the guard gives while a partition moves."""
    error = reply.get("error")
    if isinstance(error, str) and error.startswith("MOVED "):
        part = error.split(" ", 2)[1]
        reply = {"ok": False, "error": f"{PARTITION_UNAVAILABLE}: node {address} does not hold "
                 f"partition {part} by its own map (it is changing hands); retry"}  # fmt: skip
    answer(client, req, reply)


def _own_timeout(cmd: Mapping[str, Any]) -> float:
    """A long-poll's own wait (PULL's `timeout`, WaitJob's), in seconds, capped at an hour."""
    value = cmd.get("timeout")
    if isinstance(value, int | float) and value > 0:
        return float(min(value, 3_600_000)) / 1000
    return 0.0


class Forwarder:
    """The front end's links to its peers, and the two ways it uses them."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        limits: ForwardLimits,
        peers: Callable[[], Sequence[str]],
    ) -> None:
        self._loop = loop
        self._limits = limits
        self._peers = peers
        self._links: dict[str, PeerLink] = {}
        self.forwards = 0  # commands forwarded (`/prometheus`: shardq_forwards_total)

    def peers(self) -> Sequence[str]:
        """The other live nodes' addresses now."""
        return self._peers()

    def link(self, address: str) -> PeerLink:
        link = self._links.get(address)
        if link is None:
            if len(self._links) >= _MAX_LINKS:
                idle = next((a for a, k in self._links.items() if k.in_flight == 0), None)
                if idle is not None:
                    self._links.pop(idle).close()
            link = self._links[address] = PeerLink(address, self._loop, self._limits)
        return link

    def forward(
        self, client: Client, req: object, name: str, frame: dict[str, Any], error: str
    ) -> bool:
        """Send a command the guard refused to its partition's holder, if `error` is `MOVED`
        and `client` did not ask for `MOVED`; False (answer `error`) otherwise."""
        if getattr(client, "no_forward", FORWARD) != FORWARD or not error.startswith("MOVED "):
            return False
        self.forwards += 1
        frame["cmd"] = name
        address = error.rsplit(" ", 1)[1]
        self.link(address).send(frame, partial(_relay, client, req, address))
        return True

    def fan_out(self, client: Client, name: str, cmd: dict[str, Any], local: Reply,
                done: OnReply) -> bool:  # fmt: skip
        """Ask the peers for a job this node's shards do not hold: `done` gets the first
        reply that shows it, else `local`. False (nothing asked) for a peer's request or when
        there are no peers."""
        peers = self._peers()
        if not peers or getattr(client, "no_forward", FORWARD) == PEER:
            return False
        self.forwards += 1
        found = _FirstOf(len(peers), name, local, done)
        cmd = {**cmd, "cmd": name}
        for address in peers:
            self.link(address).send(cmd, found.part)
        return True

    def fan_out_counts(self, client: Client, name: str, cmd: dict[str, Any], done: OnReply) -> bool:
        """Send a heartbeat batch (JobHeartbeatB, ExtendLocks) to every peer: `done` gets one
        reply counting the jobs they all found (a peer that cannot answer counts none: its
        jobs' leases are not renewed, as a restarting shard's are not). False (nothing
        asked) for a peer's request or when there are no peers."""
        peers = self._peers()
        if not peers or getattr(client, "no_forward", FORWARD) == PEER:
            return False
        self.forwards += 1
        gather = Gather(len(peers), lambda replies: done(_summed(name, replies)))
        cmd = {**cmd, "cmd": name}
        for k, address in enumerate(peers):
            self.link(address).send(cmd, partial(gather.part, k))
        return True

    def gather_peers(
        self, client: Client, cmd: dict[str, Any], done: Callable[[list[Reply]], None]
    ) -> bool:
        """Send `cmd` to every peer: `done` gets their replies in peer order (an error reply
        for a peer that could not answer, or did not within `gather_timeout_ms`), each with
        the peer's address in `node`. False
        (nothing asked) for a peer's own request or when there are no peers
        (`Router.gather_nodes`)."""
        peers = self._peers()
        if not peers or getattr(client, "no_forward", FORWARD) == PEER:
            return False
        self.forwards += 1
        gather = Gather(len(peers), done)
        for k, address in enumerate(peers):
            on_reply = partial(_named, address, partial(gather.part, k))
            self.link(address).send(dict(cmd), on_reply, self._limits.gather_timeout_s)
        return True

    def tell_peers(self, cmd: dict[str, Any], done: Callable[[list[Reply]], None]) -> bool:
        """Send `cmd` to every peer whoever asked this node (a peer's forward too): the
        clean-up a change made here owes the other nodes (a moved schedule's old copies).
        A peer takes it on its link as a peer's request: for its own shards only, so it goes
        no further. False (nothing sent) when there are no peers."""
        peers = self._peers()
        if not peers:
            return False
        self.forwards += 1
        gather = Gather(len(peers), done)
        for k, address in enumerate(peers):
            self.link(address).send(dict(cmd), partial(gather.part, k))
        return True

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()


def _named(address: str, on_reply: OnReply, reply: Reply) -> None:
    """A peer's reply names the peer (`node`): a cluster-wide answer lists the nodes that did
    not answer (`_aggregate`), and an error made here for a link does not say whose it was."""
    reply.setdefault(NODE_FIELD, address)
    on_reply(reply)


def _summed(name: str, replies: list[Reply]) -> Reply:
    """The peers' replies to a heartbeat batch as one: their counts added, errors as none."""
    ok = [r for r in replies if r.get("ok") is True]
    return combine_batch(name, [], [[] for _ in ok], ok) if ok else no_count(name)


class _FirstOf:
    """The peers' replies to one id command: the first that shows the job wins. When none
    does, a peer that could not answer makes "not found" a guess, so its error answers (as a
    restarting shard's does among shards); else this node's own "not found"."""

    __slots__ = ("_done", "_left", "_local", "_name", "_over", "_unanswered")

    def __init__(self, n: int, name: str, local: Reply, done: OnReply) -> None:
        self._left, self._name, self._local, self._done = n, name, local, done
        self._over = False
        self._unanswered: Reply | None = None

    def part(self, reply: Reply) -> None:
        self._left -= 1
        if self._over:
            return
        if str(reply.get("error", "")).startswith((NODE_UNAVAILABLE, NODE_BUSY)):
            self._unanswered = self._unanswered or reply
        elif is_found(self._name, reply):
            self._over = True
            self._done(reply)
            return
        if self._left == 0:
            self._over = True
            self._done(self._unanswered or self._local)
