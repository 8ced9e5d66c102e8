"""The front end process: the only one that touches client sockets.

    python -m shardq.runtime.frontend --spec '<ChildSpec JSON>'

One asyncio loop serves a TCP listener (bunqueue framing, `_tcp`) and a ZeroMQ ROUTER
(`_zmq`); both feed the same `Dispatcher`, which batches commands per shard per loop
turn. Requests and replies travel over one Unix stream link per shard (`frontend._links`); the
supervisor's notices (a shard died, or is up again) arrive on the PULL socket
`spec.endpoint("front")`.

Back-pressure: when a shard's link buffers more than its high-water mark, the front end stops
reading from every client (TCP `pause_reading`, ROUTER not polled) until it has drained,
instead of buffering without bound.

SIGTERM drains (docs/runtime.md): stop accepting connections, send `drain` to every shard,
keep serving the open connections until each shard reports `drained` or
`shutdown_timeout_ms` passes, then close the client sockets *without* releasing their leases
and exit 0. SIGINT is ignored: the supervisor orders the shutdown.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

import structlog
import zmq
import zmq.asyncio

from shardq.cluster._map import PartitionGuard, held_pairs, write_holding
from shardq.protocol._fields import schema_limits
from shardq.runtime import _messages as msgs
from shardq.runtime._child import SpecError, SupervisorLink, parse_spec_args
from shardq.runtime._curve import read_curve_secret
from shardq.runtime._gcstats import GcClock
from shardq.runtime._giveback import IdleGiveBack, IdleGrowth, give_back_when_quiet
from shardq.runtime._logging import configure
from shardq.runtime._ports import AuthThrottle, descriptor_limit
from shardq.runtime._spec import ChildSpec
from shardq.runtime._spin import STATS as SPIN_STATS
from shardq.runtime._spin import SpinningSelector, spin_policy
from shardq.runtime._ssrf import SsrfRules
from shardq.runtime._tls import server_context
from shardq.runtime.frontend._backups import BackupCommand
from shardq.runtime.frontend._cluster import ClusterCommand
from shardq.runtime.frontend._dispatch import Dispatcher
from shardq.runtime.frontend._event_relay import EventRelay
from shardq.runtime.frontend._events import EventLimits
from shardq.runtime.frontend._forward import Forwarder, ForwardLimits, no_forward
from shardq.runtime.frontend._handoff import Handoffs
from shardq.runtime.frontend._links import ShardLinks
from shardq.runtime.frontend._monitoring import MonitoringCommands
from shardq.runtime.frontend._tcp import TcpGateway, TcpLimits
from shardq.runtime.frontend._zmq import ZmqGateway
from shardq.runtime.links._control import pack, unpack

__all__ = ["Frontend", "main"]

_BURST: Final = 1000  # shard messages taken per wake-up before the loop gets a turn
_TCP_BACKLOG: Final = 1024

_log = structlog.get_logger()
GC_CLOCK: Final = GcClock()


class Frontend:
    """The sockets, tasks and drain of the front end, around a `Dispatcher`."""

    def __init__(self, spec: ChildSpec, loop: asyncio.AbstractEventLoop) -> None:
        self.spec = spec
        self.loop = loop
        self._ctx = zmq.asyncio.Context()
        # The supervisor link is a plain (blocking-API) socket on the same context.
        self.sup = SupervisorLink(zmq.Context.shadow(self._ctx.underlying), spec)
        self._links = ShardLinks(
            [spec.link_path(i) for i in range(spec.shards)],
            loop,
            on_message=self._on_shard_message,
            on_down=self._link_down,
            on_up=self._link_up,
            on_blocked=self._shards_blocked,
            max_frame=spec.links.link_max_frame_bytes,
        )
        # The writer hands the replies of committed durable pushes straight over (one hop
        # less than through their shard, docs/runtime.md). Connected in the background and
        # again whenever it drops; while it is down the shards answer them, as they can.
        self._writer_link = ShardLinks(
            [spec.writer_link_path],
            loop,
            on_message=self._on_writer_message,
            on_down=_nothing,
            on_up=self._writer_up,
            on_blocked=_nothing,
            name="writer",
        )
        self.dispatcher = Dispatcher(
            spec.shards,
            self._links.send,
            loop,
            spec.tcp.auth_tokens,
            rate_window_s=spec.frontend.stats_rate_window_s,
            link_max_frame_bytes=spec.links.link_max_frame_bytes,
            max_parked_per_connection=spec.frontend.max_parked_per_connection,
            max_parked=spec.frontend.max_parked,
            auth_max_failures=spec.tcp.auth_max_failures,
            auth_throttle=AuthThrottle(
                spec.tcp.auth_max_failures,
                spec.tcp.auth_failure_window_ms / 1000,
                spec.tcp.auth_failure_delay_ms / 1000,
                spec.tcp.auth_failure_max_delay_ms / 1000,
            ),
            internal_token=spec.internal_token,
            unanswered_command=spec.frontend.test_unanswered_command,
            cache_size=spec.frontend.job_cache_size,
            webhook_rules=SsrfRules.of(
                spec.webhooks.webhook_allow_private, spec.webhooks.webhook_allow_networks
            ),
            events=EventLimits.from_spec(spec),
        )
        router, handle = self.dispatcher.router, self.dispatcher.handle
        router.hold_s = spec.process.shard_recycle_hold_ms / 1000
        router.cache.max_bytes = spec.frontend.job_cache_max_mb << 20
        router.hold_max_bytes = spec.process.shard_recycle_hold_max_bytes
        self.dispatcher.add_handlers(MonitoringCommands(router, handle, spec).handlers)
        orphans = self.dispatcher.flows.orphans
        orphans.grace_ms, orphans.max_watched = (
            spec.frontend.flow_children_grace_ms,
            spec.frontend.flow_children_watch_max,
        )
        self.dispatcher.add_handlers(BackupCommand(spec).handlers)
        self.dispatcher.add_handlers(ClusterCommand(spec, self._forwards).handlers)
        self.dispatcher.limits = schema_limits(spec.engine)
        self.dispatcher.pass_pushb = spec.tcp.pushb_pass_through  # before `guard_partitions`
        # asyncio accepts up to a whole backlog of connections before any reaches the gateway,
        # so one burst's worth of descriptors is kept free too, and the burst kept to a quarter
        # of what the limit leaves: at the cap an accept never fails for want of a descriptor.
        room = descriptor_limit() - spec.tcp.reserved_fds
        self._backlog = min(_TCP_BACKLOG, max(16, room // 4))
        limits = TcpLimits.from_spec(spec)
        limits = replace(limits, reserved_fds=limits.reserved_fds + self._backlog)
        self._guard: PartitionGuard | None = None
        self._holding: frozenset[int] | None = None  # as last written (`_publish_holding`)
        self.forwarder: Forwarder | None = None
        self.relay: EventRelay | None = None
        self.dispatcher.add_handlers({"NoForward": no_forward})
        if spec.external_store:
            # Several nodes may share the database: serve only the partitions held, and
            # forward the other nodes' queues to them (docs/cluster.md).
            cluster = spec.cluster
            guard = self._guard = PartitionGuard(
                spec.run_dir, cluster.node_id, cluster.partitions, spec.shards
            )
            guard.refresh()
            self.dispatcher.on_shard_kind(msgs.LOADED, self._on_loaded)
            self.forwarder = Forwarder(loop, ForwardLimits.from_spec(spec), lambda: guard.peers)
            self.dispatcher.guard_partitions(guard.refusal, self.forwarder.forward)
            self.dispatcher.router.peers = self.forwarder.fan_out
            self.dispatcher.router.peer_counts = self.forwarder.fan_out_counts
            self.dispatcher.router.peer_gather = self.forwarder.gather_peers
            self.dispatcher.router.peer_tell = self.forwarder.tell_peers
            self.dispatcher.flows.span_nodes(guard.refusal, self.forwarder)
            self.dispatcher.rewait_moved(loop, cluster.lease_ms / 1000)
            # Subscribers here get the events of the other nodes' queues too.
            hub = self.dispatcher.events
            self.relay = EventRelay(
                loop,
                ForwardLimits.from_spec(spec),
                lambda: guard.peers,
                lambda events: hub.on_events(events, relayed=True),
            )
            hub.on_want = self.relay.set_want
        self.tcp = TcpGateway(self.dispatcher, loop, limits)
        self.handoffs: Handoffs | None = None
        if spec.tcp.tcp_handoff and spec.tcp.direct_shards:
            # Bunqueue connections that only push to one shard are served by it (`_handoff`).
            self.handoffs = Handoffs(
                self.dispatcher,
                spec.handoff_path,
                after=spec.tcp.tcp_handoff_after,
                backoff_s=spec.tcp.tcp_handoff_backoff_ms / 1000,
                max_bytes=spec.tcp.tcp_handoff_max_bytes,
            )
            self.handoffs.attach(loop)
            self.tcp.handoffs = self.handoffs
        self.zmq = ZmqGateway(self.dispatcher, self._ctx, limits)
        self._inbox = self._ctx.socket(zmq.PULL)
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self._draining = False

    def _forwards(self) -> int:
        return 0 if self.forwarder is None else self.forwarder.forwards

    async def start(self) -> dict[str, str]:
        """Bind every socket and start serving; return the client addresses.

        Raises `OSError` or `zmq.ZMQError` if a port or endpoint cannot be bound.
        """
        spec = self.spec
        self._inbox.bind(spec.endpoint("front"))
        await self._links.connect_all()
        self._writer_link.reconnect(0)
        self._server = await self.loop.create_server(
            self.tcp.factory, spec.tcp.host, spec.tcp.tcp_port, reuse_address=True,
            backlog=self._backlog, ssl=_server_tls(spec),
        )  # fmt: skip
        tcp_port = self._server.sockets[0].getsockname()[1]
        _server_curve(self.zmq.router, spec)
        zmq_port = self.zmq.bind(spec.tcp.host, spec.tcp.zmq_port)
        self._tasks = [
            self.loop.create_task(self._read_supervisor()),
            self.loop.create_task(self.zmq.run()),
        ]
        give_back = IdleGrowth.give_back(spec.process)
        if give_back.enabled:
            idle = IdleGiveBack(give_back, self._compact)
            self._tasks.append(self.loop.create_task(give_back_when_quiet(idle, give_back.idle_s)))
        if self._guard is not None:
            self._tasks.append(self.loop.create_task(self._watch_cluster(self._guard)))
            await self._leases_taken(self._guard)
            await self._shards_caught_up(self._guard)
        self.loop.add_signal_handler(signal.SIGTERM, self.begin_drain)
        host = f"[{spec.tcp.host}]" if ":" in spec.tcp.host else spec.tcp.host
        return {"tcp": f"{host}:{tcp_port}", "zmq": f"tcp://{host}:{zmq_port}"}

    async def wait(self) -> None:
        """Return once the drain has finished."""
        await self._stopped.wait()

    def _compact(self) -> tuple[()]:
        """What the front end gives back besides the collection: its job-to-shard cache (a
        miss asks every shard; the next replies fill it again)."""
        self.dispatcher.router.cache.clear()
        return ()

    def _shards_blocked(self, blocked: bool) -> None:
        self.tcp.shards_blocked(blocked)
        self.zmq.shards_blocked(blocked)

    def _on_shard_message(self, msg: dict[str, Any]) -> None:
        self.dispatcher.on_shard_message(msg)

    def _on_loaded(self, msg: Mapping[str, Any]) -> None:
        shard = msg.get("shard")
        if self._guard is not None and type(shard) is int:
            self._guard.loaded(shard, list(held_pairs(msg)))
            self._publish_holding(self._guard)

    def _publish_holding(self, guard: PartitionGuard) -> None:
        """Tell the lease thread which partitions the shards still hold (`HOLDING_FILE`)."""
        holding = guard.holding()
        if self._holding is not None and not holding >= self._holding:
            # The shards dropped partitions: ids cached for them would go to a shard that
            # answers "not found" instead of to the node that holds them now.
            self.dispatcher.router.cache.clear()
        if holding != self._holding:
            try:
                write_holding(self.spec.run_dir, holding)
            except OSError as e:
                _log.warning("cannot write the holding file", error=str(e))
            else:
                self._holding = holding

    def _link_down(self, shard: int) -> None:
        if self._guard is not None:
            self._guard.forget(shard)
            self._publish_holding(self._guard)
        if shard in self.dispatcher.router.held:
            self.dispatcher.router.lost_while_held(shard)  # a recycle: its replacement comes
        elif shard not in self.dispatcher.down:
            self.dispatcher.on_shard_message(msgs.shard_down(shard))

    def _link_up(self, shard: int) -> None:
        self.dispatcher.on_shard_message(msgs.shard_up(shard))

    def _writer_up(self, _index: int) -> None:
        self._writer_link.send(0, pack(msgs.front()))  # the writer learns who we are

    def _on_writer_message(self, msg: dict[str, Any]) -> None:
        if msg.get("t") == msgs.REP:  # the only kind the writer sends here
            self.dispatcher.on_shard_message(msg)
        else:
            _log.warning("unexpected message on the writer link dropped", t=msg.get("t"))

    async def _read_supervisor(self) -> None:
        """The supervisor's messages: a restarted shard is up (reconnect), or one died."""
        sync: zmq.Socket[bytes] = zmq.Socket.shadow(self._inbox.underlying)
        while True:
            await self._inbox.poll()
            for _ in range(_BURST):
                try:
                    data = sync.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    msg = unpack(data)
                except ValueError:
                    _log.warning("undecodable internal message dropped", size=len(data))
                    continue
                if msg.get("t") == msgs.SHARD_UP and isinstance(msg.get("shard"), int):
                    # Up for clients only once the link is connected again (`_link_up`).
                    self.dispatcher.router.confirm(msg["shard"])
                    self._links.reconnect(msg["shard"])
                else:
                    self.dispatcher.on_shard_message(msg)
            else:
                await asyncio.sleep(0)

    async def _watch_cluster(self, guard: PartitionGuard) -> None:
        """Re-read the writer's cluster map a few times per lease renewal, and tell the shards
        behind it which partitions the node holds (`parts`: they load and drop, then answer
        `loaded`), when the leases change and again every `parts_resend_ms` while a shard is
        behind (docs/cluster.md). A `parts` goes after the requests already routed, so none
        for a dropped queue reaches a shard after it."""
        period = max(0.05, self.spec.cluster.lease_ms / 10_000)
        resend_s = self.spec.cluster.parts_resend_ms / 1000
        told: frozenset[tuple[int, int]] | None = None
        next_resend = 0.0
        while True:
            guard.refresh()
            behind = guard.behind()
            now = time.monotonic()
            if behind and (guard.holdings != told or now >= next_resend):
                told, next_resend = guard.holdings, now + resend_s
                pairs = sorted(told)
                parts = msgs.parts([p for p, _ in pairs], [e for _, e in pairs])
                for shard in behind:
                    self.dispatcher.router.control(shard, parts)
            if self.relay is not None:
                self.relay.sync()  # peers that came or went, links that broke
            await asyncio.sleep(period)

    async def _leases_taken(self, guard: PartitionGuard) -> None:
        """Wait (at most a lease) for the lease thread's first round after this front end
        began to listen: only then does the node take its partitions (`writer._cluster`)."""
        deadline = time.monotonic() + self.spec.cluster.lease_ms / 1000
        next_progress = time.monotonic() + 0.25
        while time.monotonic() < deadline:
            guard.refresh()
            if guard.listening:
                return
            await asyncio.sleep(0.01)
            if time.monotonic() >= next_progress:
                self.sup.progress()  # as in `_shards_caught_up`
                next_progress = time.monotonic() + 0.25
        _log.warning("the lease thread has not seen this node listen; serving what it holds")

    async def _shards_caught_up(self, guard: PartitionGuard) -> None:
        """Wait (at most a lease) until every shard holds what the leases say, so a node
        that reports ready serves its partitions at once."""
        deadline = time.monotonic() + self.spec.cluster.lease_ms / 1000
        next_progress = time.monotonic() + 0.25
        while guard.behind() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            if time.monotonic() >= next_progress:
                # The supervisor waits `ready_timeout_ms` for ready or progress (a lease may
                # be longer): this is progress.
                self.sup.progress()
                next_progress = time.monotonic() + 0.25

    # -- shutdown --------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """SIGTERM: start the drain once (a repeated signal changes nothing)."""
        if not self._draining:
            self._draining = True
            self._tasks.append(self.loop.create_task(self._drain()))

    async def _drain(self) -> None:
        timeout = self.spec.process.shutdown_timeout_ms / 1000
        _log.info("front end draining", connections=len(self.tcp.connections))
        if self._server is not None:
            self._server.close()
        self.dispatcher.start_drain()
        try:
            await asyncio.wait_for(self.dispatcher.all_drained.wait(), timeout)
        except TimeoutError:
            missing = sorted(set(range(self.spec.shards)) - self.dispatcher.drained)
            _log.warning("drain timeout; closing with jobs active", shards=missing)
        # Leases are not released: jobs still active are charged by the next start's recovery.
        self.dispatcher.release_on_close = False
        self.tcp.close_all()
        _log.info("front end stopped", **SPIN_STATS.fields(), **GC_CLOCK.fields())
        self._stopped.set()

    async def close(self) -> None:
        """Cancel the tasks, close every socket with linger 0 and terminate the context."""
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        self.tcp.close_all()
        if self.handoffs is not None:
            self.handoffs.close()
        self.zmq.close()
        self._links.close()
        self._writer_link.close()
        if self.forwarder is not None:
            self.forwarder.close()
        if self.relay is not None:
            self.relay.close()
        self._inbox.close(linger=0)
        self.sup.close()
        self._ctx.term()


def _server_tls(spec: ChildSpec) -> ssl.SSLContext | None:
    """The TLS context of the TCP port, or None for plain TCP (the config checked the pair)."""
    if not (spec.tcp.tls_cert_file and spec.tcp.tls_key_file):
        return None
    return server_context(spec.tcp.tls_cert_file, spec.tcp.tls_key_file)


def _server_curve(router: zmq.Socket[Any], spec: ChildSpec) -> None:
    """Make the ROUTER a CURVE server when a secret key is configured (before it binds).

    Any client key is accepted (no ZAP handler): CURVE here encrypts and authenticates the
    server; clients still prove themselves with `Auth` tokens.
    """
    if not spec.tcp.zmq_curve_secret_file:
        return
    secret = read_curve_secret(spec.tcp.zmq_curve_secret_file)
    router.curve_secretkey = secret
    router.curve_server = True
    _log.info("zeromq curve on", public_key=zmq.curve_public(secret).decode())


async def serve(spec: ChildSpec) -> int:
    """Run the front end until its drain ends; return the exit code."""
    frontend = Frontend(spec, asyncio.get_running_loop())
    try:
        try:
            addresses = await frontend.start()
        except (OSError, zmq.ZMQError) as e:
            _log.error("front end cannot bind", error=str(e))
            frontend.sup.fatal(f"front end cannot bind: {e}")
            return 1
        frontend.sup.ready(addresses=addresses)
        GC_CLOCK.install()
        _log.info(
            "front end ready",
            spin_us=spec.process.spin_us,
            max_connections=frontend.tcp.max_connections,
            **addresses,
        )
        await frontend.wait()
        return 0
    finally:
        await frontend.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m shardq.runtime.frontend --spec JSON`; returns the exit code."""
    try:
        spec = parse_spec_args(sys.argv[1:] if argv is None else argv)
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    configure("frontend", spec.process.log_format, spec.process.log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    policy = spin_policy(
        spec.process.spin_us,
        spec.process.spin_auto_max_us,
        spec.process.spin_auto_max_runnable,
        spec.process.spin_auto_cut_us,
        spec.process.spin_auto_cut_turns,
    )
    if policy is None:
        return asyncio.run(serve(spec))
    selector = SpinningSelector(policy)
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector)) as runner:
        return runner.run(serve(spec))


def _nothing(_value: object) -> None:
    """The writer link's up/down and back-pressure: nothing to do (it sends one message)."""
