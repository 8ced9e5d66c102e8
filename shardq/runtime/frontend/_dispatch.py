"""The front end's request flow: decoded frames in, shard batches out, replies back.

`Dispatcher` knows nothing about TCP or ZeroMQ: a connection is a `Client` (an id, an auth
flag, `send` and `drop`). Per frame it applies the session and error rules (docs/protocol.md
§3.2, §13.1), answers `Hello`, `Ping` and `Auth` itself (and, through `_bunqueue`, the worker
registry, `Metrics` and the flow refusals), and sends everything else to the shards:

- a command with a `queue` goes to `shard_of(queue, N)`;
- a command that names one job by id goes to the shard the job cache names; on a miss it goes
  to every shard and the first reply that shows the job wins (`is_found`);
- `ACKB`, `JobHeartbeatB` and `ExtendLocks` are split per shard by position and recombined;
- `ListQueues` and `Stats` go to every shard and are merged;
- the Cron commands are routed by `_cron.py` (a schedule lives on the shard of its queue);
- the webhook commands go to shard 0 (`_webhooks.py`).

Commands bound for one shard in one loop turn leave as one `req` message (flushed once per turn
with `loop.call_soon`). Each forwarded command gets an int `rid`; the shard echoes it and the
callback registered under it gets the reply.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final

import structlog
from msgpack import packb  # type: ignore[import-untyped]

from shardq._version import __version__
from shardq.errors import ProtocolError
from shardq.protocol import (
    INTERNAL_SERVER_ERROR,
    NOT_AUTHENTICATED,
    DecodedFrame,
    check_command,
    error_reply,
    req_id,
    unknown_command,
)
from shardq.protocol._fields import Limits
from shardq.protocol._prepacked import WIRE_MODE_KEY
from shardq.protocol._schema import check as schema_check
from shardq.runtime import _clock
from shardq.runtime import _messages as msgs
from shardq.runtime._ports import AuthThrottle
from shardq.runtime._routing import shard_of
from shardq.runtime._ssrf import SsrfRules
from shardq.runtime.frontend._auth import MAX_AUTH_FAILURE_RECORDS, AuthGate
from shardq.runtime.frontend._bunqueue import BunqueueCommands, LocalHandler
from shardq.runtime.frontend._commands import (
    BUNQUEUE_COMMANDS,
    ID_BATCH_COMMANDS,
    ID_COMMANDS,
    SHARD_COMMANDS,
)
from shardq.runtime.frontend._cron import CronRoutes
from shardq.runtime.frontend._events import EventHub, EventLimits
from shardq.runtime.frontend._flows import FlowRoutes
from shardq.runtime.frontend._limits import (
    PARKING_COMMANDS,
    ParkedSlots,
    parks,
)
from shardq.runtime.frontend._merge import (
    JobCache,
    aligned,
    combine_batch,
    learned_ids,
    merge_list_queues,
    merge_stats,
    shard_unavailable,
    sub_batch,
)
from shardq.runtime.frontend._presence import WorkerPresence
from shardq.runtime.frontend._replies import (
    Client,
    FirstFound,
    Gather,
    OnReply,
    ParkedClient,
    Reply,
)
from shardq.runtime.frontend._webhooks import WebhookRoutes
from shardq.runtime.links._control import pack
from shardq.runtime.links._stream import MAX_FRAME_BYTES, split_batch

__all__ = ["Client", "Dispatcher", "Reply"]


_ABSENT: Final = object()  # the frame had no reqId: the reply carries none either
# The field naming the job, for the id commands that do not call it `id`.
_ID_FIELDS: Final = {"GetJobByCustomId": "customId", "UpdateParent": "childId"}
INVALID_COMMAND_NESTING: Final = "Invalid command: nested too deeply"
_PULLS: Final = frozenset({"PULL", "PULLB"})
_PUSHES: Final = frozenset({"PUSH", "PUSHB"})  # may name a parent that must exist (_flows)
# Connections remembered for the cancels pushed to them: the bound of the Auth failure records,
# for the same reason (a TCP one leaves when it closes; ZeroMQ peers never say goodbye).
MAX_PULLERS: Final = MAX_AUTH_FAILURE_RECORDS

_log = structlog.get_logger()


def _pass_through(client: Client, cmd: dict[str, Any]) -> None:
    """Let the shard pack a PULLB's reply in its final form for a TCP or ZeroMQ client (their
    `wire_mode` says how numbers go), to be passed on as bytes (`protocol._prepacked`)."""
    cmd.pop(WIRE_MODE_KEY, None)  # never a client's to choose
    mode = getattr(client, "wire_mode", None)
    if mode is not None:
        cmd[WIRE_MODE_KEY] = mode


class _Direct:
    """The reply of a command sent to one shard goes straight back to its client."""

    __slots__ = ("client", "dispatcher", "name", "req", "shard")

    def __init__(
        self, dispatcher: Dispatcher, client: Client, req: object, name: str, shard: int
    ) -> None:
        self.dispatcher = dispatcher
        self.client = client
        self.req = req
        self.name = name
        self.shard = shard

    def __call__(self, reply: Reply) -> None:
        self.dispatcher.learn(self.name, self.shard, reply)
        self.dispatcher.answer(self.client, self.req, reply)


class Dispatcher:
    """Routes client commands to shards and shard replies to clients."""

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
        self._link_max = link_max_frame_bytes
        self.parked = ParkedSlots(max_parked_per_connection, max_parked)
        self.limits = Limits()  # the process sets the configured ones
        self._send = send
        self._loop = loop
        self.auth = AuthGate(
            auth_tokens,
            self.answer,
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
        self.cache = JobCache() if cache_size is None else JobCache(cache_size)
        self._rids = itertools.count(1)
        self._pending: dict[int, tuple[int, OnReply]] = {}  # rid -> (shard, callback)
        self.down: set[int] = set()  # shards the supervisor reported dead, not yet back
        self._outbox: list[list[list[Any]]] = [[] for _ in range(shards)]
        self._control: list[list[Mapping[str, Any]]] = [[] for _ in range(shards)]
        self._flush_scheduled = False
        self._started = time.monotonic()
        self.drained: set[int] = set()
        self.all_drained = asyncio.Event()
        self.release_on_close = True
        self._pullers: dict[str, Client] = {}  # conn -> a client that pulled (`_push_cancels`)
        self._local: dict[str, Callable[[Client, object, dict[str, Any]], None]] = {
            "Hello": self._hello,
            "Ping": self._ping,
            "Stats": self._stats,
            "ListQueues": self._list_queues,
            "AuthCheck": self.auth.auth_check,
        }
        self._local.update(CronRoutes(self).handlers)
        hooks = WebhookRoutes(self, webhook_rules)
        self._local.update(hooks.handlers)
        self.flows = FlowRoutes(self, loop)
        self._local.update(self.flows.handlers)
        # The worker registry and the legacy Metrics.
        self.bunqueue = BunqueueCommands(
            self.answer, self._gather_all, rate_window_s, self.pending_per_shard, self._route
        )
        self._local.update(self.bunqueue.handlers)
        self.events = EventHub(shards, self.control, self.answer, events)
        self.bunqueue.presence = WorkerPresence(shards, self.control)  # for skipIfNoWorker
        self._local.update(self.events.handlers)

    def add_handlers(self, handlers: dict[str, LocalHandler]) -> None:
        """Answer these commands in the front end (the process's own, e.g. monitoring)."""
        self._local.update(handlers)

    @property
    def auth_required(self) -> bool:
        return self.auth.required

    @property
    def pending(self) -> int:
        """Forwarded commands still waiting for a shard's reply."""
        return len(self._pending)

    def pending_per_shard(self) -> list[int]:
        """`pending` by shard: each shard's mailbox as the front end sees it (requests sent and
        not answered yet, parked long-polls included). O(pending): for a scrape, not a loop."""
        counts = [0] * self.shards
        for shard, _ in self._pending.values():
            counts[shard] += 1
        return counts

    # -- frames in -------------------------------------------------------------------------

    def handle(self, client: Client, frame: DecodedFrame) -> None:
        """Answer or forward one decoded frame. Never raises for any frame content."""
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
        req = frame.pop("reqId", _ABSENT)
        try:
            self._dispatch(client, req, name, frame)
        except Exception:
            # A bug met by one command must not cost the connection the commands behind it.
            _log.exception("command failed", command=name)
            self.answer(client, req, error_reply(INTERNAL_SERVER_ERROR))

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
            and ("parentId" in frame or "childrenIds" in frame or name == "PUSHB")
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
        frame["_conn"] = client.conn
        if name in _PULLS:
            self._note_puller(client)
            if name == "PULLB":
                _pass_through(client, frame)
        routed = self.bunqueue.before_route(client, req, name, frame)
        if routed is not None:
            if name in PARKING_COMMANDS and parks(name, frame):
                routed = self._park(routed, frame)
            self._route(routed, req, name, frame)

    def answer(self, client: Client, req: object, reply: Reply) -> None:
        """Send `reply` to `client` with the request's `reqId` echoed verbatim, if it had one."""
        if req is not _ABSENT:
            reply["reqId"] = req
        client.send(reply)

    def _park(self, client: Client, cmd: dict[str, Any]) -> Client:
        """A long-poll within the caps holds a slot until it is answered; past them it is
        sent with no timeout, so its shard answers at once as if nothing were ready."""
        if self.parked.take(client.conn):
            return ParkedClient(self.parked, client)
        cmd["timeout"] = 0
        return client

    def is_internal(self, client: Client) -> bool:
        """Whether `client` is the HTTP process's internal link: it authenticated with the
        supervisor's per-run `internal_token` (`AuthGate`)."""
        return bool(getattr(client, "internal", False))

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
        self.answer(client, req, reply)

    def _ping(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        now_ms = int(_clock.wall() * 1000)
        self.answer(client, req, {"ok": True, "data": {"pong": True, "time": now_ms}})

    # -- routing ---------------------------------------------------------------------------

    def _route(self, client: Client, req: object, name: str, cmd: dict[str, Any]) -> None:
        queue = cmd.get("queue")
        if isinstance(queue, str) or self.shards == 1:
            shard = shard_of(queue, self.shards) if isinstance(queue, str) else 0
            self._ask(shard, client.conn, cmd, _Direct(self, client, req, name, shard))
        elif name in ID_COMMANDS:
            self._by_id(client, req, name, cmd)
        elif name in ID_BATCH_COMMANDS:
            self._by_ids(client, req, name, cmd)
        else:
            # A queue command without a usable queue: any shard gives the engine's error.
            self._ask(0, client.conn, cmd, _Direct(self, client, req, name, 0))

    def _by_id(self, client: Client, req: object, name: str, cmd: dict[str, Any]) -> None:
        key = cmd.get(_ID_FIELDS.get(name, "id"))
        shard = self.cache.get(key)
        if shard is not None:
            self._ask(shard, client.conn, cmd, _Direct(self, client, req, name, shard))
            return

        def done(found: int | None, reply: Reply) -> None:
            if found is not None:
                self.cache.learn([key], found)
                self.learn(name, found, reply)
            self.answer(client, req, reply)

        self._ask_all_first(client.conn, name, cmd, done)

    def _ask_all_first(
        self, conn: str, name: str, cmd: dict[str, Any], done: Callable[[int | None, Reply], None]
    ) -> None:
        collector = FirstFound(self.shards, name, done)
        for shard in range(self.shards):
            self._ask(shard, conn, cmd, partial(collector.part, shard))

    def _by_ids(self, client: Client, req: object, name: str, cmd: dict[str, Any]) -> None:
        """Split a batch by the shard of each id; ids not in the cache are looked up everywhere.

        ACKB's misses go one id at a time to every shard (a shard refuses a whole ACKB that
        names a job it does not hold); the heartbeat batches never refuse, so their misses go
        to every shard as one part and the counts add up.
        """
        if not aligned(name, cmd):
            self._ask(0, client.conn, cmd, _Direct(self, client, req, name, 0))
            return
        ids: list[Any] = cmd["ids"]
        groups: dict[int, list[int]] = {}
        misses: list[int] = []
        for i, job_id in enumerate(ids):
            shard = self.cache.get(job_id)
            if shard is None:
                misses.append(i)
            else:
                groups.setdefault(shard, []).append(i)
        plan: list[tuple[int | None, list[int]]] = list(groups.items())
        if misses and name == "ACKB":
            plan.extend((None, [i]) for i in misses)
        elif misses:
            plan.extend((shard, misses) for shard in range(self.shards))
        parts = [indices for _, indices in plan]
        finish = partial(self._batch_done, client, req, name, ids, parts)
        if not plan:
            finish([])
            return
        gather = Gather(len(plan), finish)
        for k, (shard, indices) in enumerate(plan):
            sub = sub_batch(name, cmd, indices)
            if shard is not None:
                self._ask(shard, client.conn, sub, partial(gather.part, k))
            else:
                self._ask_all_first(client.conn, name, sub, partial(self._miss_done, gather, k))

    def _miss_done(self, gather: Gather, k: int, found: int | None, reply: Reply) -> None:
        gather.part(k, reply)

    def _batch_done(
        self,
        client: Client,
        req: object,
        name: str,
        ids: list[Any],
        parts: list[list[int]],
        replies: list[Reply],
    ) -> None:
        self.answer(client, req, combine_batch(name, ids, parts, replies))

    def _list_queues(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        self._gather_all(client, frame, lambda rs: self.answer(client, req, merge_list_queues(rs)))

    def _stats(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        uptime = int((time.monotonic() - self._started) * 1000)
        rates = self.bunqueue.counters.rates()
        self._gather_all(
            client, frame, lambda rs: self.answer(client, req, merge_stats(rs, uptime, rates))
        )

    def _gather_all(
        self, client: Client, frame: dict[str, Any], done: Callable[[list[Reply]], None]
    ) -> None:
        frame["_conn"] = client.conn
        gather = Gather(self.shards, done)
        for shard in range(self.shards):
            self._ask(shard, client.conn, frame, partial(gather.part, shard))

    gather_all = _gather_all  # the monitoring commands' CompactMemory asks every shard

    def learn(self, name: str, shard: int, reply: Reply) -> None:
        """Remember where the jobs a reply names live (only worth it with several shards)."""
        if self.shards > 1:
            ids = learned_ids(name, reply)
            if ids:
                self.cache.learn(ids, shard)

    # -- to and from the shards ------------------------------------------------------------

    def _ask(self, shard: int, conn: str, cmd: dict[str, Any], on_reply: OnReply) -> None:
        if shard in self.down:
            # Answered on the next turn, like a real reply: callers never see re-entrancy.
            self._loop.call_soon(on_reply, shard_unavailable(shard))
            return
        rid = next(self._rids)
        self._pending[rid] = (shard, on_reply)
        self._outbox[shard].append([conn, rid, cmd])
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send each shard its batch of this turn, then its control messages, in that order."""
        self._flush_scheduled = False
        for shard in range(self.shards):
            items = self._outbox[shard]
            if items:
                self._outbox[shard] = []
                data, items = self._pack_batch(items)
                if len(data) > self._link_max:
                    # Rare (several large pushes in one turn): the shard refuses a frame
                    # over the limit, so the batch goes in parts.
                    packed = [packb(item) for item in items]
                    for part in split_batch(msgs.REQ, packed, self._link_max):
                        self._send(shard, part)
                else:
                    self._send(shard, data)
            control = self._control[shard]
            if control:
                self._control[shard] = []
                for msg in control:
                    self._send(shard, pack(msg))

    def _pack_batch(self, items: list[list[Any]]) -> tuple[bytes, list[list[Any]]]:
        """One `req` message, and the items it holds. A command nested close to msgpack's depth
        limit decodes from the client but cannot be packed again inside the batch: it alone is
        refused (one pass per item, only then), and the rest of the batch goes on."""
        try:
            return pack(msgs.req(items)), items
        except ValueError:
            kept: list[list[Any]] = []
            for item in items:
                try:
                    pack(msgs.req([item]))
                except ValueError:
                    _owner, on_reply = self._pending.pop(item[1])
                    self._loop.call_soon(on_reply, error_reply(INVALID_COMMAND_NESTING))
                else:
                    kept.append(item)
            return pack(msgs.req(kept)), kept

    def on_shard_message(self, msg: Mapping[str, Any]) -> None:
        """Take one message from a shard (`rep` or `drained`). Never raises."""
        kind = msg.get("t")
        if kind == msgs.REP:
            for item in msg.get("items") or ():
                self._deliver(item)
        elif kind == msgs.SHARD_DOWN:
            self._shard_down(msg.get("shard"))
        elif kind == msgs.EVENTS:
            self.events.on_events(msg.get("items"))
        elif kind == msgs.SHARD_UP:
            self.down.discard(msg.get("shard"))
            self.events.shard_up(msg.get("shard"))  # type: ignore[arg-type]
            self.bunqueue.presence.shard_up(msg.get("shard"))  # type: ignore[union-attr,arg-type]
        elif kind == msgs.FLOW:
            self.flows.on_notices(msg)
        elif kind == msgs.CANCEL:
            self._push_cancels(msg.get("items"))
        elif kind == msgs.DRAINED:
            self.drained.add(msg.get("shard"))  # type: ignore[arg-type]
            if len(self.drained) >= self.shards:
                self.all_drained.set()
        else:
            _log.warning("unknown internal message dropped", t=kind)

    def _shard_down(self, shard: object) -> None:
        """Answer every request the dead shard holds, and those not sent to it yet."""
        if not isinstance(shard, int) or not 0 <= shard < self.shards:
            return
        self.down.add(shard)
        self._outbox[shard] = []
        self._control[shard] = []
        lost = [rid for rid, (owner, _) in self._pending.items() if owner == shard]
        _log.warning("shard down; answering its requests", shard=shard, requests=len(lost))
        for rid in lost:
            _owner, on_reply = self._pending.pop(rid)
            on_reply(shard_unavailable(shard))

    def _deliver(self, item: Any) -> None:
        try:
            _conn, rid, reply = item
            pending = self._pending.pop(rid, None)
            if pending is not None:
                pending[1](reply)
        except Exception:
            # A reply we cannot route must not stop the replies behind it.
            _log.exception("shard reply dropped")

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
        event. A connection gone or not reading misses it; the job is dead-lettered anyway."""
        for item in items if isinstance(items, list) else ():
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
            self._control[shard].append(msgs.close(conn))
        self._schedule_flush()

    def control(self, shard: int, msg: Mapping[str, Any]) -> None:
        """Send `msg` to `shard` at once, ahead of requests still in this turn's batch (so a
        `listen` precedes every request that follows a subscription); dropped while down."""
        if shard not in self.down:
            self._send(shard, pack(msg))

    def start_drain(self) -> None:
        """Ask every shard to stop handing out jobs; `all_drained` is set once all report."""
        for shard in range(self.shards):
            self._control[shard].append(msgs.drain())
        self._schedule_flush()
