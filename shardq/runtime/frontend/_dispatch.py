"""The front end's session rules: decoded frames in, each answered here or routed.

`Dispatcher` knows nothing about TCP or ZeroMQ: a connection is a `Client` (an id, an auth
flag, `send` and `drop`). Per frame it applies the session and error rules (docs/protocol.md
§3.2, §13.1), answers `Hello`, `Ping` and `Auth` itself, looks every other command up in its
table of front-end commands, and forwards the rest to the shards through the `Router`
(`_router.py`), which owns the outbox and the requests in flight.

The front-end commands are tables handed the router, never the dispatcher: the Cron commands
(`_cron.py`: a schedule lives on the shard of its queue), the webhook commands (`_webhooks.py`:
shard 0), the flows that span shards (`_flows.py`), job events (`_events.py`), the worker
registry, `Metrics`, `Stats` and `ListQueues` (`_bunqueue.py`), and the process's own
(monitoring, backups) through `add_handlers`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final

import structlog

from shardq._version import __version__
from shardq.errors import ProtocolError
from shardq.protocol import (
    INTERNAL_SERVER_ERROR,
    NOT_AUTHENTICATED,
    check_command,
    decode_body,
    error_reply,
    req_id,
    unknown_command,
)
from shardq.protocol._direct import HELLO_DIRECT, HELLO_SHARDS, flow_entries
from shardq.protocol._fields import Limits
from shardq.protocol._prepacked import JS_NUMBERS, PLAIN_NUMBERS
from shardq.protocol._rawpush import Incoming, RawPush
from shardq.protocol._schema import check as schema_check
from shardq.runtime import _clock
from shardq.runtime import _messages as msgs
from shardq.runtime._ports import AuthThrottle
from shardq.runtime._ssrf import SsrfRules
from shardq.runtime.frontend._auth import MAX_AUTH_FAILURE_RECORDS, AuthGate, is_internal
from shardq.runtime.frontend._bunqueue import BunqueueCommands, LocalHandler
from shardq.runtime.frontend._commands import BUNQUEUE_COMMANDS, ID_BATCH_COMMANDS, SHARD_COMMANDS
from shardq.runtime.frontend._cron import CronRoutes
from shardq.runtime.frontend._events import EventHub, EventLimits
from shardq.runtime.frontend._flows import FlowRoutes
from shardq.runtime.frontend._limits import PARKING_COMMANDS, ParkedSlots, parks
from shardq.runtime.frontend._merge import JobCache
from shardq.runtime.frontend._replies import NO_REQ_ID, Client, ParkedClient, Reply, answer
from shardq.runtime.frontend._rewait import rewaiting
from shardq.runtime.frontend._router import Router
from shardq.runtime.frontend._webhooks import WebhookRoutes
from shardq.runtime.links._stream import MAX_FRAME_BYTES

__all__ = ["Client", "Dispatcher", "Reply"]


_PULLS: Final = frozenset({"PULL", "PULLB"})
_PUSHES: Final = frozenset({"PUSH", "PUSHB"})  # may name a parent that must exist (_flows)
_NO_FIELDS: Final[dict[str, Any]] = {}  # what `before_route` reads of a passed-through PUSHB
# Connections remembered for the cancels pushed to them: the bound of the Auth failure records,
# for the same reason (a TCP one leaves when it closes; ZeroMQ peers never say goodbye).
MAX_PULLERS: Final = MAX_AUTH_FAILURE_RECORDS

_log = structlog.get_logger()


# Sends a command the partition guard refused to the node holding its queue (`_forward.py`):
# (client, req, name, frame, the refusal) -> whether it did.
Forward = Callable[[Client, object, str, dict[str, Any], str], bool]


# A PULLB's envelope for each wire mode; shared, as nothing changes an envelope once made.
_WIRE_ENVELOPES: Final[dict[object, msgs.ReqEnvelope]] = {
    mode: {msgs.ENVELOPE_WIRE: mode} for mode in (PLAIN_NUMBERS, JS_NUMBERS)
}


def _ignored(_msg: Mapping[str, Any]) -> None:
    """A message with nothing to do here (see where it is registered)."""


def _pass_through(client: Client) -> msgs.ReqEnvelope | None:
    """Let the shard pack a PULLB's reply in its final form for a TCP or ZeroMQ client (their
    `wire_mode` says how numbers go), to be passed on as bytes (`protocol._prepacked`). It
    travels in the request's envelope: never a client's to choose."""
    return _WIRE_ENVELOPES.get(getattr(client, "wire_mode", None))


# Front-end commands on one queue that the partition guard covers too (`guard_partitions`);
# `Metrics` with a `queue` (without one it answers for every node, `_aggregate`).
_QUEUE_LOCAL: Final = ("Cron", "DashboardQueue", "Metrics")


def _guarded_local(
    refused: Callable[[Client, object, str, dict[str, Any]], bool],
    name: str,
    handler: LocalHandler,
    client: Client,
    req: object,
    frame: dict[str, Any],
) -> None:
    if not refused(client, req, name, frame):
        handler(client, req, frame)


class Dispatcher:
    """Applies the session rules to client frames, answers the front end's own commands and
    forwards the rest through the `Router`."""

    answer = staticmethod(answer)

    def __init__(
        self,
        shards: int,
        send: Callable[[int, bytes], None],
        loop: asyncio.AbstractEventLoop,
        auth_tokens: Sequence[str] = (),
        cache_size: int | None = None,
        rate_window_s: int = 5,
        link_max_frame_bytes: int = MAX_FRAME_BYTES,
        *,
        max_parked_per_connection: int = 1_000,
        max_parked: int = 10_000,
        auth_max_failures: int = 3,
        auth_throttle: AuthThrottle | None = None,
        internal_token: str = "",
        unanswered_command: str = "",
        webhook_rules: SsrfRules = SsrfRules(),  # noqa: B008 (frozen, so shared safely)
        events: EventLimits = EventLimits(),  # noqa: B008 (frozen, so shared safely)
    ) -> None:
        self.shards = shards
        self.cache = JobCache() if cache_size is None else JobCache(cache_size)
        self.router = router = Router(shards, send, loop, self.cache, link_max_frame_bytes)
        self.down = router.down  # the same set: shards reported dead, not yet back
        # Bound once: forwarding a client command is one direct call into the router.
        self._route = router.route
        self.parked = ParkedSlots(max_parked_per_connection, max_parked)
        self.limits = Limits()  # the process sets the configured ones
        self.auth = AuthGate(
            auth_tokens,
            answer,
            loop,
            max_failures=auth_max_failures,
            throttle=(
                AuthThrottle(auth_max_failures, 60.0, 0.25, 30.0)
                if auth_throttle is None
                else auth_throttle
            ),
            internal_token=internal_token,
        )
        self._unanswered = unanswered_command  # test-only (ServerConfig.test_unanswered_command)
        # `[tcp] pushb_pass_through`: a PUSHB read as a `RawPush` goes to its shard undecoded.
        # Off on a node among several (`guard_partitions`): the guard reads the decoded map.
        self.pass_pushb = True
        self.drained: set[int] = set()
        self.all_drained = asyncio.Event()
        self.draining = False
        self.release_on_close = True
        self._pullers: dict[str, Client] = {}  # conn -> a client that pulled (`_push_cancels`)
        # The cancels of connections a shard serves now go to it (`Handoffs.forward_cancels`):
        # given the items, it returns those left for this process to push.
        self.forward_cancels: Callable[[list[Any]], list[Any]] | None = None
        # Told of each shard's direct port as it is announced (`Handoffs.link`).
        self.direct_announced: Callable[[int], None] | None = None
        # The shards' direct ports (`shard._direct`), announced by each shard; Hello hands
        # them to clients while every shard has one and is up. None in a cluster: the
        # partition guard lives here, and a direct push would pass it by.
        self.direct_ports: dict[int, int] | None = {}
        # The worker registry, Metrics, Stats and ListQueues.
        self.bunqueue = BunqueueCommands(router, rate_window_s)
        self.flows = FlowRoutes(router, loop, partial(self._to_shard, checked=True))
        self.events = EventHub(shards, router.control_now, answer, events)
        self._local: dict[str, LocalHandler] = {
            "Hello": self._hello,
            "Ping": self._ping,
            "AuthCheck": self.auth.auth_check,
        }
        # What the shards (and the supervisor, about them) send: one handler per kind.
        self._from_shards: dict[object, Callable[[Mapping[str, Any]], None]] = {
            msgs.REP: self._on_rep,
            msgs.EVENTS: self._on_events,
            msgs.FLOW: self.flows.on_notices,
            msgs.CANCEL: self._on_cancel,
            msgs.DRAINED: self._on_drained,
            msgs.SHARD_DOWN: self._on_shard_down,
            msgs.SHARD_UP: self._on_shard_up,
            msgs.DIRECT: self._on_direct,
            msgs.RECYCLE: lambda msg: self.router.hold(msg.get("shard")),
            msgs.RECYCLE_OFF: lambda msg: self.router.call_off(msg.get("shard")),
            # A shard answers `parts` with `loaded`; only a node on a shared database sends
            # `parts`, and its front end takes these over (`on_shard_kind`).
            msgs.LOADED: _ignored,
            # The handoff socket's answers (`_handoff`), taken by `Handoffs` when it is on.
            msgs.TOOK: _ignored,
            msgs.HANDBACK: _ignored,
            msgs.GONE: _ignored,
        }
        for table in (
            CronRoutes(router).handlers,
            WebhookRoutes(router, webhook_rules).handlers,
            self.flows.handlers,
            self.bunqueue.handlers,
            self.events.handlers,
        ):
            self._local.update(table)

    def add_handlers(self, handlers: dict[str, LocalHandler]) -> None:
        """Answer these commands in the front end (the process's own, e.g. monitoring)."""
        self._local.update(handlers)

    def on_shard_kind(self, kind: str, handler: Callable[[Mapping[str, Any]], None]) -> None:
        """Take the shards' messages of this kind with `handler` (the process's own)."""
        self._from_shards[kind] = handler

    @property
    def auth_required(self) -> bool:
        return self.auth.required

    @property
    def pending(self) -> int:
        """Forwarded commands still waiting for a shard's reply."""
        return self.router.pending

    # -- frames in -------------------------------------------------------------------------

    def handle(self, client: Client, frame: Incoming) -> None:
        """Answer or forward one decoded frame. Never raises for any frame content."""
        if isinstance(frame, RawPush):
            self._raw_push(client, frame)
            return
        if isinstance(frame, ProtocolError):
            client.send(error_reply(str(frame), frame.req_id))
            if frame.fatal:
                client.drop(str(frame))
            return
        try:
            name = check_command(frame)
        except ProtocolError as e:
            client.send(error_reply(str(e), req_id(frame)))
            return
        req = frame.pop("reqId", NO_REQ_ID)
        try:
            self._dispatch(client, req, name, frame)
        except Exception:
            # A bug met by one command must not cost the connection the commands behind it.
            _log.exception("command failed", command=name)
            self.answer(client, req, error_reply(INTERNAL_SERVER_ERROR))

    def _raw_push(self, client: Client, raw: RawPush) -> None:
        """A PUSHB to its shard as the client's bytes (`protocol._rawpush`): what `_dispatch`
        and `_to_shard` do with a PUSHB that names no flow, without its map. Anything else
        that could make a difference (no authentication yet, pass-through off, the test-only
        unanswered command) and a body the shard refuses take the general path."""
        if not (self.pass_pushb and client.authenticated) or self._unanswered == "PUSHB":
            self.handle(client, decode_body(raw.body))
            return
        req = raw.req if raw.has_req else NO_REQ_ID
        try:
            routed = self.bunqueue.before_route(client, req, "PUSHB", _NO_FIELDS)
            if routed is not None:
                self.router.route_raw(routed, req, raw, partial(self._raw_refused, client, raw))
        except Exception:
            _log.exception("command failed", command="PUSHB")
            self.answer(client, req, error_reply(INTERNAL_SERVER_ERROR))

    def _raw_refused(self, client: Client, raw: RawPush) -> None:
        """The shard did not take a passed-through body (it changed nothing): it goes the
        general path, which answers it as it always did."""
        self.handle(client, decode_body(raw.body))

    def _dispatch(self, client: Client, req: object, name: str, frame: dict[str, Any]) -> None:
        if name == "Auth":
            self.auth.auth(client, req, frame)
        elif not client.authenticated:
            self.answer(client, req, error_reply(NOT_AUTHENTICATED))
        elif name == self._unanswered:
            return  # test-only: the request a test needs left unanswered
        elif name in self._local:
            # The front end's own commands meet the schema here; the shards' in their engine.
            error = schema_check(name, frame, self.limits)
            if error:
                self.answer(client, req, error_reply(error))
            else:
                self._local[name](client, req, frame)
        elif name in SHARD_COMMANDS:
            self._to_shard(client, req, name, frame)
        elif name in BUNQUEUE_COMMANDS:
            self.answer(client, req, error_reply(f"Unsupported command: {name}"))
        else:
            self.answer(client, req, error_reply(unknown_command(name)))

    def _to_shard(
        self, client: Client, req: object, name: str, frame: dict[str, Any], checked: bool = False
    ) -> None:
        if (
            name in _PUSHES
            and not checked
            and (
                "parentId" in frame
                or "childrenIds" in frame
                or (name == "PUSHB" and flow_entries(frame))
            )
            and self.flows.check_parents(client, req, name, frame)
        ):
            return  # sent on (`checked`) once each parent it names is found
        if name in ID_BATCH_COMMANDS:
            # Checked before the front end fans a batch out id by id (the shards check it
            # too): 100,000 unknown ids would be 200,000 lookups before a refusal.
            error = schema_check(name, frame, self.limits)
            if error:
                self.answer(client, req, error_reply(error))
                return
        envelope = None
        if name in _PULLS:
            self._note_puller(client)
            if name == "PULLB":
                envelope = _pass_through(client)
        routed = self.bunqueue.before_route(client, req, name, frame)
        if routed is not None:
            if name in PARKING_COMMANDS and parks(name, frame):
                routed = self._park(routed, frame)
            self._route(routed, req, name, frame, envelope)

    def guard_partitions(
        self, refusal: Callable[[str], str | None], forward: Forward | None = None
    ) -> None:
        """Refuse a command for a queue this node does not serve now (several nodes on one
        database, docs/cluster.md): `refusal(queue)` gives the error (`MOVED ...`) or None.
        Installed over `_to_shard` only then, so a node alone pays nothing for it. `forward`
        may send a refused command to its holder instead (True: it did, `_forward.py`)."""
        unguarded = self._to_shard
        self.direct_ports = None
        self.pass_pushb = False  # `refused` and `forward` read the decoded map

        def refused(client: Client, req: object, name: str, frame: dict[str, Any]) -> bool:
            queue = frame.get("queue")
            if type(queue) is str:
                error = refusal(queue)
                if error is not None:
                    if forward is None or not forward(client, req, name, frame, error):
                        self.answer(client, req, error_reply(error))
                    return True
            return False

        def to_shard(
            client: Client, req: object, name: str, frame: dict[str, Any], checked: bool = False
        ) -> None:
            # `refused` inlined: this runs for every command of a node on PostgreSQL.
            queue = frame.get("queue")
            if type(queue) is str:
                error = refusal(queue)
                if error is not None:
                    # Counted here, where the client sent it (`BunqueueCommands.before_route`).
                    counted = self.bunqueue.before_route(client, req, name, frame) or client
                    if forward is None or not forward(counted, req, name, frame, error):
                        self.answer(client, req, error_reply(error))
                    return
            unguarded(client, req, name, frame, checked)

        self._to_shard = to_shard  # type: ignore[method-assign]
        # The front end's own commands that act on one queue's shard: a schedule must live
        # with its queue (the writer's fence would refuse its pushes anywhere else).
        for name in _QUEUE_LOCAL:
            handler = self._local.get(name)
            if handler is not None:
                self._local[name] = partial(_guarded_local, refused, name, handler)

    def rewait_moved(self, loop: asyncio.AbstractEventLoop, lease_s: float) -> None:
        """Several nodes: a WaitJob whose job passes to another node while it waits is routed
        again, to wherever the job is then (`_rewait.py`)."""
        self._route = rewaiting(self.router.route, loop, lease_s)
        self.pass_pushb = False  # every command through `_route`, as a node among several

    def _park(self, client: Client, cmd: dict[str, Any]) -> Client:
        """A long-poll within the caps holds a slot until it is answered; past them it is
        sent with no timeout, so its shard answers at once as if nothing were ready."""
        if self.parked.take(client.conn):
            return ParkedClient(self.parked, client)
        cmd["timeout"] = 0
        return client

    is_internal = staticmethod(is_internal)

    def _hello(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        # bunqueue answers its own version; answering 2 to a client that asks for 2 keeps
        # bunqueue-client 0.1.5 (which checks for 2) and v3 clients both working
        # (docs/protocol.md §3.1).
        version = 2 if frame.get("protocolVersion") == 2 else 3
        caps = ["pipelining"] if version == 2 else ["pipelining", "separate-job-name"]
        reply = {
            "ok": True,
            "protocolVersion": version,
            "capabilities": caps,
            "server": "bunqueue",  # compat clients and upstream readiness probes check this
            "version": __version__,
        }
        ports = self.direct_ports
        if ports and len(ports) == self.shards and not self.down:
            reply[HELLO_SHARDS] = self.shards
            reply[HELLO_DIRECT] = [ports[i] for i in range(self.shards)]
        self.answer(client, req, reply)

    def _ping(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        now_ms = int(_clock.wall() * 1000)
        self.answer(client, req, {"ok": True, "data": {"pong": True, "time": now_ms}})

    def on_shard_message(self, msg: Mapping[str, Any]) -> None:
        """Take one message from a shard, or about one from the supervisor (`shard-down`,
        `shard-up`). Never raises for an unknown kind: it is logged and dropped."""
        handler = self._from_shards.get(msg.get("t"))
        if handler is None:
            _log.warning("unknown internal message dropped", t=msg.get("t"))
        else:
            handler(msg)

    def _on_rep(self, msg: Mapping[str, Any]) -> None:
        self.router.deliver(msg.get("items"))

    def _on_shard_down(self, msg: Mapping[str, Any]) -> None:
        if self.direct_ports is not None:
            self.direct_ports.pop(msg.get("shard"), None)  # type: ignore[arg-type]
        self.router.shard_down(msg.get("shard"))

    def _on_direct(self, msg: Mapping[str, Any]) -> None:
        shard, port = msg.get("shard"), msg.get("port")
        if self.direct_ports is not None and type(shard) is int and type(port) is int:
            self.direct_ports[shard] = port
            if self.direct_announced is not None:
                self.direct_announced(shard)

    def _on_events(self, msg: Mapping[str, Any]) -> None:
        self.events.on_events(msg.get("items"))

    def _on_shard_up(self, msg: Mapping[str, Any]) -> None:
        self.down.discard(msg.get("shard"))
        self.events.shard_up(msg.get("shard"))  # type: ignore[arg-type]
        self.bunqueue.presence.shard_up(msg.get("shard"))  # type: ignore[arg-type]
        self.router.release(msg.get("shard"))  # after the `listen` above: it goes first
        if self.draining:  # a shard restarted during the drain never got its `drain`
            self.router.control(msg.get("shard"), msgs.drain())  # type: ignore[arg-type]

    def _on_cancel(self, msg: Mapping[str, Any]) -> None:
        self._push_cancels(msg.get("items"))

    def _on_drained(self, msg: Mapping[str, Any]) -> None:
        self.drained.add(msg.get("shard"))  # type: ignore[arg-type]
        if len(self.drained) >= self.shards:
            self.all_drained.set()

    def _note_puller(self, client: Client) -> None:
        """Remember a connection that may hold leases, for the cancels pushed to it. A TCP
        one is forgotten when it closes; ZeroMQ peers never close, so they are capped."""
        pullers = self._pullers
        if client.conn not in pullers:
            if len(pullers) >= MAX_PULLERS:
                del pullers[next(iter(pullers))]
            pullers[client.conn] = client

    def _push_cancels(self, items: object) -> None:
        """Tell the connections running these jobs that they were cancelled
        (`Cancel {active: true}`): `{type: "cancel", jobId, queue, reason}`, unasked, like an
        event; those of a connection handed off to a shard are sent to that shard, which
        writes them. A connection gone or not reading misses it; the job is dead-lettered
        anyway."""
        if not isinstance(items, list):
            return
        if self.forward_cancels is not None:
            items = self.forward_cancels(items)
        for item in items:
            if not isinstance(item, dict):
                continue
            client = self._pullers.get(str(item.get("conn")))
            push = getattr(client, "push_event", None)
            if push is None:
                continue
            msg = {"type": "cancel", "jobId": item.get("jobId"), "queue": item.get("queue"),
                   "reason": item.get("reason")}  # fmt: skip
            if not push(msg, {}, self.events.buffer_bytes):
                _log.warning("cancel not pushed: the worker is not reading",
                             conn=item.get("conn"), job_id=item.get("jobId"))  # fmt: skip

    def connection_closed(self, conn: str) -> None:
        """Tell every shard, after this turn's batches, that `conn` is gone (lease release)."""
        self._pullers.pop(conn, None)
        self.bunqueue.connection_closed(conn)
        self.events.forget(conn)
        self.auth.forget(conn)
        if not self.release_on_close:
            return
        for shard in range(self.shards):
            self.router.control(shard, msgs.close(conn))

    def start_drain(self) -> None:
        """Ask every shard to stop handing out jobs; `all_drained` is set once all report.
        A shard that is down now misses its `drain`: it is asked again when it is back."""
        self.draining = True
        for shard in range(self.shards):
            self.router.control(shard, msgs.drain())
