"""The ZeroMQ side of the front end: a ROUTER socket for DEALER (or REQ) clients.

Each message is `[identity, (empty,)? , msgpack map]`; the map is the same command map as a TCP
frame's body, and the reply goes back to the same identity with the same envelope. A ZeroMQ
client's connection id is `"z" + identity.hex()`.

ZeroMQ reports no disconnects to a ROUTER, so there is no `close` for these connections: the
leases of a vanished ZeroMQ client are not released early, they lapse by their TTL (and its
pending long-polls are answered into the void). Auth state is kept per identity, for the
100,000 identities seen most recently; an identity pushed out must send `Auth` again.

Of the TCP bounds (`_tcp.py`), the rate limit (per identity), the parked long-poll caps, the
Auth failures and the pre-Auth frame cap apply here too. The in-flight cap applies per
identity: past it a message waits, decoded, for the identity's earlier replies; a ROUTER
cannot stop reading one peer, so once `max_in_flight_per_connection` messages wait across all
identities the ROUTER is read no further. The write backlog does not apply (a peer's full
queue drops replies, as ZeroMQ does).

Ports that cannot be starved (docs/operations.md, "Ports"): libzmq drops a peer that does not
finish its ZMTP (and CURVE) handshake within `zmq_handshake_timeout_ms` (ZMQ_HANDSHAKE_IVL).
libzmq offers no cap on a ROUTER's connections and no idle close, so neither applies here. A
peer's failed Auths count against its source address, which libzmq reports per message
(`Peer-Address`) when auth tokens are set; where it cannot (older libzmq, ipc), the address is
"" and all such peers share one count.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from typing import Any, Final

import structlog
import zmq
import zmq.asyncio

from shardq.errors import ProtocolError
from shardq.protocol import decode_body, frame_too_large
from shardq.protocol._prepacked import PLAIN_NUMBERS, WIRE_KEY, prepacked_body
from shardq.protocol._rawpush import Incoming, decode_or_peek
from shardq.runtime.frontend._dispatch import Dispatcher
from shardq.runtime.frontend._limits import RateWindow, rate_refusal
from shardq.runtime.frontend._tcp import TcpLimits
from shardq.runtime.links._control import pack

__all__ = ["ZmqGateway", "ZmqPeer"]

MAX_PEERS: Final = 100_000  # identities whose auth state is remembered
_BURST: Final = 1000  # messages taken per wake-up before the loop gets a turn

_log = structlog.get_logger()
# `zmq.POLLIN` is an `enum.IntFlag`: `&` on it builds a new flag in Python (about 0.5 µs).
_POLLIN: Final = int(zmq.POLLIN)


class ZmqPeer:
    """One ZeroMQ client identity, as the dispatcher's `Client`."""

    __slots__ = (
        "address",
        "authenticated",
        "conn",
        "envelope",
        "gateway",
        "held",
        "in_flight",
        "internal",
        "no_forward",
        "rate",
    )
    wire_mode = PLAIN_NUMBERS  # how a shard packs a reply passed through to it

    def __init__(
        self, gateway: ZmqGateway, identity: bytes, authenticated: bool, rate: RateWindow | None
    ) -> None:
        self.gateway = gateway
        self.conn = "z" + identity.hex()
        self.authenticated = authenticated
        self.envelope: list[bytes] = [identity]
        self.rate = rate
        self.in_flight = 0  # messages handed to the dispatcher and not answered yet
        self.held: deque[Incoming] = deque()  # messages past the in-flight cap
        self.address = ""  # the source address of its latest message, when libzmq says
        self.internal = False
        self.no_forward = 0  # `NoForward` (frontend._forward): 0 forwards

    def send(self, reply: dict[str, Any]) -> None:
        self.in_flight -= 1
        self.gateway.send(self.envelope, reply)
        if self.held:
            self.gateway.release_soon(self)

    def push_event(self, msg: dict[str, Any], frames: dict[str, bytes], limit: int) -> bool:
        """Send a server-initiated event; False when the peer's queue is full (its high-water
        mark stands for the byte bound here: a ROUTER cannot tell bytes unread)."""
        data = frames.get("zmq")
        if data is None:
            data = frames["zmq"] = pack(msg)
        return self.gateway.send_raw(self.envelope, data)

    def drop(self, reason: str) -> None:
        # A ROUTER cannot close one peer; the oversize message was refused and is logged.
        _log.warning("zeromq message refused", conn=self.conn, reason=reason)


class ZmqGateway:
    """Reads the ROUTER socket, decodes messages and hands them to the dispatcher."""

    def __init__(self, dispatcher: Dispatcher, ctx: zmq.asyncio.Context, limits: TcpLimits) -> None:
        self.dispatcher = dispatcher
        self.router = ctx.socket(zmq.ROUTER)
        # The same cap as a TCP frame; libzmq disconnects a peer that sends a bigger message
        # before it is ever buffered whole.
        self.router.setsockopt(zmq.MAXMSGSIZE, limits.max_frame_bytes)
        if limits.zmq_handshake_timeout_ms:
            self.router.setsockopt(zmq.HANDSHAKE_IVL, limits.zmq_handshake_timeout_ms)
        self._sync: zmq.Socket[bytes] = zmq.Socket.shadow(self.router.underlying)
        self._limits = limits
        self._max = limits.max_frame_bytes
        self._max_unauthenticated = min(self._max, limits.unauthenticated_max_frame_bytes)
        self._peers: OrderedDict[bytes, ZmqPeer] = OrderedDict()
        self._max_in_flight = limits.max_in_flight
        self._held = 0  # messages held past their peer's in-flight cap, all peers together
        self._releasing: set[ZmqPeer] = set()
        self._blocked_by_shards = False
        self._resume = asyncio.Event()
        self._resume.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_scheduled = False

    def bind(self, host: str, port: int) -> int:
        """Bind on tcp://host:port (0 = any free port); return the port. Raises `ZMQError`."""
        if ":" in host:
            self.router.setsockopt(zmq.IPV6, 1)
            host = f"[{host}]"
        if port == 0:
            return self.router.bind_to_random_port(f"tcp://{host}")
        self.router.bind(f"tcp://{host}:{port}")
        return port

    def shards_blocked(self, blocked: bool) -> None:
        """Stop (or resume) taking messages while a shard mailbox is full."""
        self._blocked_by_shards = blocked
        self._update_resume()

    def _update_resume(self) -> None:
        # Held messages are bounded like one TCP connection's: past that, the ROUTER is read
        # no further (every peer waits; a ROUTER cannot stop reading only one).
        if self._blocked_by_shards or self._held >= self._max_in_flight:
            self._resume.clear()
        else:
            self._resume.set()

    async def run(self) -> None:
        """Serve until cancelled."""
        self._loop = asyncio.get_running_loop()
        while True:
            await self._resume.wait()
            # ZeroMQ's readiness signal is edge-triggered and shared by every operation on the
            # socket: a reply sent in between can consume the edge of a request that arrived.
            # So look at the socket's events before sleeping on it.
            if not self._readable():
                await self.router.poll()
            self._drain()
            await asyncio.sleep(0)

    def _readable(self) -> bool:
        return bool(int(self._sync.get(zmq.EVENTS)) & _POLLIN)

    def _drain(self) -> None:
        """Take up to a burst of waiting messages (stops while the shards push back)."""
        self._drain_scheduled = False
        for _ in range(_BURST):
            if not self._resume.is_set():
                return
            try:
                if self.dispatcher.auth_required:
                    # Frames, not bytes: only a frame knows its peer's address.
                    frames = self._sync.recv_multipart(zmq.NOBLOCK, copy=False)
                    self._on_message([f.bytes for f in frames], _peer_address(frames[-1]))
                else:
                    self._on_message(self._sync.recv_multipart(zmq.NOBLOCK), "")
            except zmq.Again:
                return

    def _on_message(self, parts: list[bytes], address: str) -> None:
        if len(parts) < 2:
            return
        peer = self._peer(parts[0])
        peer.address = address
        peer.envelope = parts[:-1]
        frame = self._decode(parts[-1], peer.authenticated)
        if peer.held or peer.in_flight >= self._max_in_flight:
            # Past the peer's in-flight cap: the message waits for its earlier ones' replies.
            peer.held.append(frame)
            self._held += 1
            self._update_resume()
            return
        self._handle(peer, frame)

    def _handle(self, peer: ZmqPeer, frame: Incoming) -> None:
        peer.in_flight += 1  # before: a command answered here is answered inside `handle`
        # The same rate limit as a TCP connection's, per identity.
        if peer.rate is not None and not peer.rate.allow(time.monotonic()):
            peer.send(rate_refusal(frame))
        else:
            self.dispatcher.handle(peer, frame)

    def release_soon(self, peer: ZmqPeer) -> None:
        """`peer` got a reply while it has messages held: hand them over on the next turn,
        once its in flight is down to half the cap (not from inside `send`: the dispatcher
        may be mid-way through a batch)."""
        if peer.in_flight <= self._max_in_flight // 2 and peer not in self._releasing:
            if not self._releasing and self._loop is not None:
                self._loop.call_soon(self._release)
            self._releasing.add(peer)

    def _release(self) -> None:
        releasing, self._releasing = self._releasing, set()
        for peer in releasing:
            while peer.held and peer.in_flight < self._max_in_flight:
                self._held -= 1
                self._handle(peer, peer.held.popleft())
        self._update_resume()

    def _peer(self, identity: bytes) -> ZmqPeer:
        peer = self._peers.get(identity)
        if peer is None:
            limits = self._limits
            rate = (
                RateWindow(limits.rate_window_ms, limits.rate_max_requests)
                if limits.rate_window_ms
                else None
            )
            peer = ZmqPeer(self, identity, not self.dispatcher.auth_required, rate)
            self._peers[identity] = peer
            if len(self._peers) > MAX_PEERS:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(identity)
        return peer

    def _decode(self, body: bytes, authenticated: bool) -> Incoming:
        limit = self._max if authenticated else self._max_unauthenticated
        if len(body) > limit:
            # Not fatal: a ROUTER cannot close one peer. libzmq has buffered the message
            # already, but it is refused before decoding.
            return ProtocolError(frame_too_large(len(body), limit))
        # The protocol holds the one definition of a valid body; a message is one frame body.
        # A PUSHB may pass to its shard undecoded (`protocol._rawpush`).
        return decode_or_peek(body) if self.dispatcher.pass_pushb else decode_body(body)

    def send(self, envelope: list[bytes], reply: dict[str, Any]) -> None:
        body = prepacked_body(reply) if WIRE_KEY in reply else pack(reply)  # the shard's bytes
        try:
            self._sync.send_multipart([*envelope, body], zmq.NOBLOCK)
        except zmq.Again:
            # The peer's queue is full (it stopped reading): ROUTER drops, as it would anyway.
            _log.debug("zeromq reply dropped", conn="z" + envelope[0].hex())
        # This send may have consumed the readiness edge of a request that just arrived; the
        # `poll` in `run` would then sleep on it forever.
        if not self._drain_scheduled and self._loop is not None and self._readable():
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def send_raw(self, envelope: list[bytes], body: bytes) -> bool:
        """Send one packed message to a peer without blocking; False if it was dropped."""
        try:
            self._sync.send_multipart([*envelope, body], zmq.NOBLOCK)
        except zmq.Again:
            return False
        if not self._drain_scheduled and self._loop is not None and self._readable():
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)
        return True

    def close(self) -> None:
        self.router.close(linger=0)


def _peer_address(frame: zmq.Frame) -> str:
    try:
        return str(frame.get("Peer-Address"))
    except (zmq.ZMQError, UnicodeDecodeError):
        return ""  # libzmq cannot tell (an ipc peer, an old libzmq): the shared "" bucket
