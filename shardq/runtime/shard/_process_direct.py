"""The shard process's direct port and handoff socket: opening them, serving them each turn,
and ending their connections at a stop. A mixin of `ShardProcess` (`_process.py`), which sets
the attributes declared below and defines `_wait`; `_direct.py` and `_handoff.py` are the
port and the socket themselves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import structlog
import zmq

from shardq.runtime import _messages as msgs
from shardq.runtime._clock import AnchoredClock
from shardq.runtime._ports import connection_cap
from shardq.runtime._spec import ChildSpec
from shardq.runtime.links._stream import batch_overhead
from shardq.runtime.shard._core import Outgoing, ShardCore
from shardq.runtime.shard._direct import DirectPort, why_not_open
from shardq.runtime.shard._handoff import HandoffChannel
from shardq.runtime.shard._wire import FrontPacker

__all__ = ["ShardDirect"]

_log = structlog.get_logger()


class ShardDirect:
    """The direct port's and the handoff socket's part of the shard process."""

    spec: ChildSpec
    core: ShardCore
    _poller: zmq.Poller
    _handoff: HandoffChannel | None
    _front_packer: FrontPacker
    clock: AnchoredClock

    if TYPE_CHECKING:

        def _wait(self, timeout_ms: int | None) -> list[dict[str, Any]]: ...
        def _send(self, out: list[Outgoing], *, block_on_front: bool = True) -> None: ...

    def _open_direct(self, spec: ChildSpec) -> DirectPort | None:
        """This shard's direct port (`shard._direct`), if `direct_shards` is on and no client
        check lives in the front end alone (`why_not_open`). Raises `OSError` if it
        cannot bind."""
        tcp = spec.tcp
        if not tcp.direct_shards:
            return None
        why = why_not_open(tcp, external_store=spec.external_store)
        if why:
            _log.info(f"direct port not opened: {why}")
            return None
        direct = DirectPort(
            tcp.host,
            spec.index,
            spec.shards,
            self._poller,
            # Like the TCP port's cap: descriptors stay free for the shard's own needs.
            max_connections=connection_cap(tcp.direct_max_connections, tcp.reserved_fds),
            max_frame_bytes=tcp.max_frame_bytes,
            max_write_bytes=tcp.tcp_max_write_backlog_bytes,
            handshake_s=tcp.tcp_handshake_timeout_ms / 1000,
            frame_s=max(tcp.tcp_idle_timeout_ms, 0) / 1000,
            idle_close_s=tcp.tcp_idle_close_ms / 1000,
            max_in_flight=tcp.max_in_flight_per_connection,
            rate_window_s=spec.frontend.stats_rate_window_s,
        )
        self.core.direct_stats = direct.stats
        _log.info("direct port open", host=tcp.host, port=direct.port)
        return direct

    def _open_handoff(self, spec: ChildSpec, direct: DirectPort | None) -> HandoffChannel | None:
        """The socket on which the front end hands this shard TCP connections
        (`shard._handoff`), with `tcp_handoff` on and the direct port open."""
        if direct is None or not spec.tcp.tcp_handoff:
            return None
        channel = HandoffChannel(
            spec.handoff_path(spec.index),
            self._poller,
            direct.adopt,
            spec.tcp.tcp_handoff_max_bytes,
            spec.tcp.tcp_handoff_gone_max,
        )
        direct.on_handback = channel.hand_back
        direct.on_gone = channel.gone
        # Workers' pulls and acks (`_direct_work`): what the front end would know or do.
        direct.holds_job = self._holds_job
        direct.final_body = self._front_packer.final_body
        direct.fit_final = self._front_packer.fit_final
        direct.reply_room = spec.links.link_max_frame_bytes - batch_overhead()
        direct.unpark = self.core.unpark
        direct.max_parked_per_connection = spec.frontend.max_parked_per_connection
        direct.max_parked = spec.frontend.max_parked
        direct.event_buffer_bytes = spec.events.events_subscriber_buffer_bytes
        return channel

    def _holds_job(self, job_id: object) -> bool:
        return type(job_id) is str and job_id in self.core.engine.store.jobs

    def _end_direct(self, direct: DirectPort) -> None:
        """Wait, at most `direct_stop_ms`, for the direct connections to take their goodbye
        (`DirectPort.release`); close those still waiting for a commit at once."""
        started = time.monotonic()
        abandoned = direct.abandon()
        if abandoned:
            _log.warning("direct connections closed with durable pushes unconfirmed",
                         connections=abandoned)  # fmt: skip
        deadline = started + self.spec.tcp.direct_stop_ms / 1000
        while direct.connections and (left := deadline - time.monotonic()) > 0:
            self._wait(direct.poll_timeout(max(int(left * 1000), 1)))  # requests: not served
        unsettled = direct.connections
        if direct.released or unsettled:
            log = _log.warning if unsettled else _log.info
            log("direct connections ended", released=direct.released, unsettled=unsettled,
                ms=round((time.monotonic() - started) * 1000))  # fmt: skip

    def _direct_out(
        self, direct: DirectPort, msg: Mapping[str, Any], block_on_front: bool
    ) -> Mapping[str, Any] | None:
        """What of `msg`, bound for the front end, is left once the direct port took its
        clients' part: its replies, and the cancels of jobs its handed-off connections hold
        (None: nothing is left)."""
        kind = msg.get("t")
        if kind == msgs.REP and direct.inflight:
            rest = direct.take(msg)
            if direct.unsent:
                # Pulled but cut from a reply too large (`HandedWork._fit`): back to waiting,
                # not active with no worker holding them, as `_send_split` does.
                ids, direct.unsent = direct.unsent, []
                now = self.clock.now()
                self.core.give_back(ids, now)
                self._send(self.core.finish_turn(now), block_on_front=block_on_front)
            return rest
        if kind == msgs.CANCEL and direct.handed_off:
            return direct.push_cancels(msg)
        return msg

    def _serve_direct(self, direct: DirectPort, ready: dict[Any, int]) -> list[list[Any]]:
        """The direct port's requests this turn, connections handed over first."""
        if self._handoff is not None:
            self._handoff.serve(ready)
        return direct.serve(ready)
