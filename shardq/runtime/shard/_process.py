"""A shard process: one `Engine` for the queues with `shard_of(queue, N) == index`.

    python -m shardq.runtime.shard --spec '<ChildSpec JSON>'

The process is a shell around `ShardCore`: it owns the sockets (docs/runtime.md), the clock
and the signals. Its loop sleeps in `zmq.Poller.poll` until a message arrives or the next
deadline (engine timer, long-poll, WaitJob) is due, so an idle shard uses no CPU.

SIGINT is ignored: a terminal's Ctrl+C reaches the whole process group, and the supervisor
orders the shutdown with SIGTERM. SIGTERM ends the loop; the shard then stops reading its
direct port (`DirectPort.quiesce`), waits (at most `shutdown_timeout_ms`) for the writer to
confirm its last batch, ends its direct connections (at most `direct_stop_ms`) and exits 0.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, cast

import structlog
import zmq

from shardq.core import Engine, EngineConfig
from shardq.core._budget import JOB_BYTES
from shardq.runtime import _messages as msgs
from shardq.runtime._child import SpecError, SupervisorLink, parse_spec_args
from shardq.runtime._clock import AnchoredClock
from shardq.runtime._giveback import IdleGrowth, rss_bytes
from shardq.runtime._logging import configure
from shardq.runtime._signals import SignalWaker
from shardq.runtime._spec import ChildSpec
from shardq.runtime._spin import STATS as SPIN_STATS
from shardq.runtime._spin import CommitSpin, SpinPolicy, commit_spin, spin_policy, spin_until
from shardq.runtime._storage import open_storage
from shardq.runtime.links._control import pack, unpack
from shardq.runtime.links._stream import LINK_ENVELOPE_BYTES, FrontLink
from shardq.runtime.links._writer import RECONNECT_EVERY_MS, WriterLink
from shardq.runtime.shard._backlog import StoreBacklog
from shardq.runtime.shard._commit_bound import WRITER_BACKLOG_BYTES, WriterBounds
from shardq.runtime.shard._core import Outgoing, ShardCore
from shardq.runtime.shard._direct import DirectPort
from shardq.runtime.shard._gc import tune_gc
from shardq.runtime.shard._loading import ShardLoading
from shardq.runtime.shard._memory import MemoryReturner
from shardq.runtime.shard._process_direct import ShardDirect
from shardq.runtime.shard._process_writer import POLLOUT, ShardWriterSide
from shardq.runtime.shard._progress import LoadStopped
from shardq.runtime.shard._recycle import RecycleCheck, ShardRecycle
from shardq.runtime.shard._salvage import salvage_replies
from shardq.runtime.shard._takeover import Holdings
from shardq.runtime.shard._wire import FrontPacker

__all__ = ["ShardProcess", "main"]


_log = structlog.get_logger()


class ShardProcess(ShardDirect, ShardLoading, ShardWriterSide, WriterBounds):
    """The sockets, clock and signals of one shard, around a `ShardCore`."""

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        # The link settings read every turn, bound once (not looked up through the spec).
        self._links = spec.links
        self.clock = AnchoredClock()
        # Reply batches go out packed by `_front_packer`, PULLB's jobs from the engine's
        # compact snapshots (`shard._wire`); the bytes are those of `_control.pack`.
        self._front_packer = FrontPacker()
        config = EngineConfig(**spec.engine)
        # Under a head budget the engine pages its cold jobs in through the shard's own store
        # (`shard._backlog`), opened on first use and kept; None keeps every job in memory.
        # A memory budget (`shard_memory_mb`) installs the head only once the shard's jobs
        # pass it (`shardq.core._budget`); the store is opened on the first read all the same.
        self._backlog: StoreBacklog | None = None
        memory = spec.process.shard_memory_mb << 20
        if config.head_jobs or memory:
            opener = partial(open_storage, spec, capped=False)
            logged = config.head_jobs or config.head_min_jobs
            self._backlog = StoreBacklog(opener, spec.index, logged)
        engine = Engine(config, compact_pulls=True, backlog=self._backlog, memory_bytes=memory)
        self.core = ShardCore(
            spec.index,
            engine,
            flow_resend_ms=spec.links.flow_resend_ms,
            batch_max_bytes=spec.links.writer_batch_max_bytes,
            batch_max_mutations=spec.links.writer_batch_max_mutations,
            memory_trim_ms=spec.process.shard_memory_trim_ms,
        )
        self._memory = MemoryReturner(
            engine,
            IdleGrowth.give_back(spec.process),
            None if self._backlog is None else self._backlog.close,
        )
        self._recycle = ShardRecycle(
            spec.index,
            RecycleCheck(
                IdleGrowth.shard_recycle(spec.process), self._jobs_estimate, self._no_recycle
            ),
            self._tell_front,
            self._recycle_go,
        )
        self.core.recycle_hook = self._recycle.go
        # Several nodes on one database: this shard holds only its node's partitions
        # (`shard._takeover`); None on SQLite, where a node holds every queue.
        self._holdings: Holdings | None = None
        if spec.external_store:
            self._holdings = Holdings(spec.index, spec.shards, spec.cluster.partitions, {})
            self.core.parts_hook = self._on_parts
        # The `loaded` answer waits for the writer to confirm this seq: a partition this
        # shard dropped is said gone only once its last mutations are committed.
        self._report_at: int | None = None
        self._ready_seq = 0
        self._stop = False
        # A stop came during the start's load (`_loading.LoadStopped`): the engine holds part
        # of the jobs, so nothing of it is sent, as if the shard had been killed then.
        self._abandoned = False
        self._spin = spin_policy(
            spec.process.spin_us,
            spec.process.spin_auto_max_us,
            spec.process.spin_auto_max_runnable,
            spec.process.spin_auto_cut_us,
            spec.process.spin_auto_cut_turns,
        )
        # With "auto": spin while one of this shard's replies waits on a commit (`CommitSpin`).
        self._commit_spin = commit_spin(
            spec.process.spin_us,
            spec.process.spin_commit_max_us,
            spec.process.spin_auto_max_runnable,
            spec.process.spin_auto_cut_us,
            spec.process.spin_auto_cut_turns,
        )
        self._ctx = zmq.Context()
        # Requests come from, and replies go to, the front end over this link (`links._stream`);
        # mutations go to, and confirmations come from, the writer over the other
        # (`links._writer`). The writer is up before any shard starts; if the link is down
        # later (a writer restart), `_wait` reconnects it.
        # One request can be a whole client frame, so the link takes at least that much.
        self._front = FrontLink(
            spec.link_path(spec.index),
            max(spec.links.link_max_frame_bytes, spec.tcp.max_frame_bytes + LINK_ENVELOPE_BYTES),
        )
        lazy = spec.links.writer_lazy_read_bytes
        self._writer = WriterLink(
            spec.writer_link_path,
            spec.writer_bell_path if lazy else None,
            lazy,
            spec.writer.flush_max_mutations,
        )
        self._writer.connect()
        self._confirm_wait_ms = spec.links.writer_confirm_wait_ms
        self._commit_waits = 0  # turns spent over `writer_unconfirmed_max_bytes`
        self._next_connect = 0.0
        self._link_fds: set[int] = set()
        # What `_watch_links` saw last (the front link's list, the writer's descriptor), and
        # the flags the writer's descriptor is polled with (`_arm_writer`; None: unknown).
        self._watched: tuple[list[int], int | None] = ([], None)
        self._writer_flags: int | None = None
        self.sup = SupervisorLink(self._ctx, spec)
        # SIGTERM arrives as bytes on a socket pair that the poll watches, so it wakes a
        # blocked poll at once and never runs code in the middle of a turn.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._signals = SignalWaker([signal.SIGTERM])
        self._signal_fd = self._signals.fileno()  # its socket's, for the shard's life
        self._poller = zmq.Poller()
        self._poller.register(self._signal_fd, zmq.POLLIN)
        self._direct: DirectPort | None = None
        self._watch_links()
        self._direct = self._open_direct(spec)
        self._handoff = self._open_handoff(spec, self._direct)

    # -- lifecycle -------------------------------------------------------------------------

    def run(self) -> int:
        """Start, serve until SIGTERM, then hand over the last batch. Returns the exit code.

        Raises `StorageError` if the database cannot be read for recovery.
        """
        early = self._start()
        if self._abandoned:
            self._end_unstarted()
            return 0
        if not self._stop:
            self._serve(early)
        if self._handoff is not None and self._direct is not None:
            # Handed-off connections go back to the front end once answered (`_handoff`).
            self._handoff.stopping = True
            self._direct.hand_back_all()
        self._finish()
        return 0

    def _start(self) -> list[dict[str, Any]]:
        """Sync with the writer, recover, report ready; return requests that came meanwhile.

        Raises `StorageError` if the database cannot be read.
        """
        early = self._sync_with_writer()
        if self._stop:
            return early
        started = time.monotonic()
        now = self.clock.now()
        try:
            jobs, queues, recovered = self._recover(now)
        except LoadStopped as stopped:
            self._abandoned = True
            ms = round((time.monotonic() - started) * 1000)
            _log.info("shard stopped while recovering", step=str(stopped), ms=ms)
            return []
        self._send(self.core.finish_turn(now))
        _log.info(
            "shard recovered",
            jobs=jobs,
            queues=queues,
            recovery_mutations=recovered,
            ms=round((time.monotonic() - started) * 1000),
            spin_us=self.spec.process.spin_us,
        )
        tune_gc()
        self._ready_seq = self.core.seq
        # Ready before the heap goes back: the front end starts now, and the few requests
        # that reach this shard before the release below is over wait for it in the link.
        self.sup.ready()
        # Recovery decoded every page of records it read: hand that heap back before serving,
        # and measure later growth from here. The completed jobs it loaded are packed now
        # (`_memory.compact_engine`), and the backlog's reader closed (its page cache).
        self._memory.idle.release(rss_bytes(), "recovered")
        self._memory.idle.rebase()
        # What the loaded jobs took per estimated byte: what a fresh process needs.
        self._recycle.check.calibrate(rss_bytes())
        return early

    # -- recycle (`shard._recycle`) ----------------------------------------------------------

    def _jobs_estimate(self) -> tuple[int, int]:
        """The bytes the shard's jobs are taken to need (the memory budget's estimate): its
        completed window's, and the other jobs'."""
        engine = self.core.engine
        each = engine.memory.job_estimate if engine.memory is not None else JOB_BYTES
        done = len(engine.store.completed_order)
        return done * each, max(0, len(engine.store.jobs) - done) * each

    def _no_recycle(self) -> str | None:
        """What forbids a recycle now, if anything. (Clients connected to the direct port do
        not: the stop ends their connections cleanly, `_end_direct`.)"""
        if self.core.waits or self.core.draining:
            return "parked WaitJob or draining"
        if self.core.active_jobs():
            return "active jobs"
        if self.core.seq == self._ready_seq:
            return "nothing written since the start"
        return None

    def _tell_front(self, msg: Mapping[str, Any]) -> bool:
        if not self._front.fds():
            return False
        self._front.send(pack(msg))
        return True

    def _recycle_go(self, rss: int) -> None:
        """The front end holds this shard's requests: tell the supervisor, then stop as for a
        SIGTERM (the last batch is committed before the exit)."""
        _log.info("shard recycling: stopping for a fresh process", rss_mb=round(rss / 2**20, 1))
        self.sup.recycled(rss)
        self._stop = True

    def _sync_with_writer(self) -> list[dict[str, Any]]:
        """Wait for the writer to confirm everything this shard's previous run had sent.

        A restarted shard may get front-end requests before it is ready; they are kept and
        served, in order, once recovery is done.
        """
        sync = pack(msgs.sync(self.spec.index, 0))
        self._writer.send(sync, urgent=True)  # if the link is down, the writer-up resends it
        early: list[dict[str, Any]] = []

        def resend(msg: dict[str, Any]) -> bool:
            # A writer (re)started: one that died may have taken our sync with it.
            self._writer.send(sync, urgent=True)
            return False

        def wait_on(msg: dict[str, Any]) -> bool:
            _log.warning("writer cannot commit yet; waiting", error=msg.get("error"))
            return False

        # The writer's answers while syncing, each saying whether the sync is over; anything
        # else waits for the end of recovery. The writer marks the answer to a sync: another
        # `done` is not for this run.
        while_syncing: dict[object, Callable[[dict[str, Any]], bool]] = {
            msgs.DONE: lambda msg: bool(msg.get("sync")),
            msgs.WRITER_UP: resend,
            msgs.FAIL: wait_on,
        }
        synced = False
        while not synced and not self._stop:
            # No timeout: a SIGTERM wakes the poll through the signal descriptor.
            for msg in self._wait(None):
                handler = while_syncing.get(msg.get("t"))
                if handler is None:
                    early.append(msg)
                elif handler(msg):
                    synced = True
        return early

    def _serve(self, early: list[dict[str, Any]]) -> None:
        now = self.clock.now()
        for msg in early:
            self.core.handle(msg, now)
        self._send(self.core.finish_turn(now))
        # A turn reads the clock three times: before its wait, after it (the turn's `now`)
        # and at its end (the idle checks'). Every check a turn makes is a compare unless its
        # source holds something (docs/runtime.md, "A shard's turn").
        core, clock, memory, recycle = self.core, self.clock, self._memory, self._recycle
        direct = self._direct
        while not self._stop:
            mono = time.monotonic()
            timeout = core.poll_timeout(clock.at(mono))
            if direct is not None:
                timeout = direct.poll_timeout(timeout)
            timeout = recycle.poll_timeout(memory.poll_timeout(timeout, mono), mono)
            if self._over_unconfirmed():
                messages = self._wait_for_commit(timeout)  # no request read (`_commit_bound`)
            else:
                messages = self._wait(timeout)
            mono = time.monotonic()
            self._check_storage(mono)
            now = clock.at(mono)
            for msg in messages:
                core.handle(msg, now)
            # The turn's batches and replies (a durable push's batch, a buffered push's batch
            # and ok, the replies a `done` released) before its timers and parked requests:
            # a client waits on them.
            first = core.early_out(now) if messages else None
            if first:
                self._send(first)
            self._send(core.finish_turn(now))  # even empty: it waits on a writer's backlog
            core.after_send()
            if self._report_at is not None:
                self._report_loaded()
            mono = time.monotonic()
            worked = bool(messages)
            memory.after_turn(worked, mono)
            recycle.after_turn(worked, mono)

    def _finish(self) -> None:
        """Send the last batch and wait, within the shutdown timeout, for its commit; then
        end the direct port's connections."""
        direct = self._direct
        if direct is not None:
            direct.quiesce()  # every request it took was handled by the last turn
        self._send(self.core.finish_turn(self.clock.now()), block_on_front=False)
        deadline = time.monotonic() + self.spec.process.shutdown_timeout_ms / 1000
        while self.core.awaiting_commit and (left := deadline - time.monotonic()) > 0:
            timeout = max(int(left * 1000), 1)
            for msg in self._wait(timeout if direct is None else direct.poll_timeout(timeout)):
                # Only the writer's answers count now: no request is served after the stop.
                if msg.get("t") in (msgs.DONE, msgs.FAIL):
                    self.core.handle(msg, self.clock.now())
            self._send(self.core.take_replies(), block_on_front=False)
        if self.core.awaiting_commit:
            _log.warning("shutdown timeout before the writer confirmed", seq=self.core.seq)
        if direct is not None:
            self._end_direct(direct)
        _log.info(
            "shard stopped",
            seq=self.core.seq,
            committed=self.core.batches.committed,
            unconfirmed_peak_bytes=self.core.batches.unconfirmed_peak,
            commit_waits=self._commit_waits,
            **SPIN_STATS.fields(),
        )

    def _stop_asked(self) -> bool:
        """Whether SIGTERM has come (read from the signal descriptor without waiting): the
        check a starting shard's load makes now and then (`_progress.Progress`)."""
        if signal.SIGTERM in self._signals.drain():
            self._stop = True
        return self._stop

    def _end_unstarted(self) -> None:
        """The stop of a shard that stopped while recovering: it answered no request, so only
        the direct port's connections (parked while it loaded) end."""
        if self._direct is not None:
            self._direct.quiesce()
            self._end_direct(self._direct)
        _log.info("shard stopped", seq=self.core.seq, recovered=False)

    def close(self) -> None:
        """Close every socket with linger 0 and terminate the context."""
        self._signals.close()
        self.sup.close()
        self._front.close()
        if self._direct is not None:
            self._direct.close()
        if self._handoff is not None:
            self._handoff.close()
        self._writer.close()
        if self._backlog is not None:
            self._backlog.close()
        self._ctx.term()

    # -- sockets ---------------------------------------------------------------------------

    def _wait(self, timeout_ms: int | None) -> list[dict[str, Any]]:
        """Sleep until a message or a signal arrives, or `timeout_ms` passes; take what came.

        Writer messages come before front-end requests. A writer link that came back is
        reported as `{"t": "writer-up"}`: the cue to resend what no writer confirmed.
        """
        self._watch_links()
        # The front link's descriptors and the writer's, as `_watch_links` just saw them.
        front_fds, writer_fd = self._watched
        if writer_fd is None:  # the writer link is down
            timeout_ms = min(timeout_ms or RECONNECT_EVERY_MS, RECONNECT_EVERY_MS)
        quiet = writer_fd is not None and self._arm_writer(writer_fd)
        if quiet:
            wait = self._confirm_wait_ms
            timeout_ms = wait if timeout_ms is None else min(timeout_ms, wait)
        ready = dict(self._poll(timeout_ms))
        if self._signal_fd in ready and signal.SIGTERM in self._signals.drain():
            # Only SIGTERM stops: the wakeup descriptor reports any signal with a Python
            # handler (a profiler's SIGUSR1, `bench/_prof`).
            self._stop = True
        messages: list[dict[str, Any]] = []
        if writer_fd is not None and (quiet or writer_fd in ready):
            if ready.get(writer_fd, 0) & POLLOUT:
                self._writer.flush()
            for data in self._writer.readable():
                self._decode(data, messages)
        if not self._writer.connected and self._reconnect_writer():
            messages.append(dict(msgs.writer_up()))  # a plain map, as decoded ones are
        for fd in front_fds:
            if fd in ready:
                for data in self._front.readable(fd):
                    self._decode(data, messages)
        direct = self._direct
        if direct is not None:
            items = self._serve_direct(direct, ready)
            if items:
                messages.append(dict(msgs.req(items)))
        return messages

    def _poll(self, timeout_ms: int | None) -> list[tuple[Any, int]]:
        """`poll`, after spinning as `spin_us` says when it would otherwise sleep."""
        spin = self._spin
        if spin is None or timeout_ms == 0:
            return self._poller.poll(timeout_ms)
        got: list[tuple[Any, int]] = []
        now = time.perf_counter()
        policy: SpinPolicy | CommitSpin = spin
        spin_s = spin.window(now)
        commit = self._commit_spin
        if commit is not None:
            commit_s = commit.window(now, self.core.batches.replies_held_here())
            if commit_s > spin_s:
                policy, spin_s = commit, commit_s
                SPIN_STATS.commit += 1
        if spin_s:
            got = spin_until(lambda: self._poller.poll(0), spin_s, policy.cut_s,
                             policy.cut_turns, policy.crowded)  # fmt: skip
        if not got:
            got = self._poller.poll(timeout_ms)
        if got:
            now = time.perf_counter()
            spin.note(now)
            if commit is not None:
                commit.arrived(now)
        return got

    @staticmethod
    def _decode(data: bytes, into: list[dict[str, Any]]) -> None:
        try:
            into.append(unpack(data))
        except ValueError:
            _log.warning("undecodable internal message dropped", size=len(data))

    def _watch_links(self) -> None:
        # The links' descriptors change when the front end connects or goes away, and when
        # the writer link drops and is made again. The front link makes a new list when its
        # descriptors change: the same list and writer descriptor as last turn, nothing to do.
        front = self._front.fds()
        writer_fd = self._writer.fd()
        if front is self._watched[0] and writer_fd == self._watched[1]:
            return
        self._watched = (front, writer_fd)
        self._writer_flags = None  # registered anew below, or gone
        fds = set(front)
        if writer_fd is not None:
            fds.add(writer_fd)
        for fd in self._link_fds - fds:
            with contextlib.suppress(KeyError):  # a quiet writer link is out of the poll
                self._poller.unregister(fd)
        new = fds - self._link_fds
        for fd in new:
            self._poller.register(fd, zmq.POLLIN)
        self._link_fds = fds
        if new and self._direct is not None and not self._direct.quiesced:
            # A front end (re)connected: it learns this shard's direct port first.
            self._front.send(pack(self._direct.announcement()))

    def _send(self, out: list[Outgoing], *, block_on_front: bool = True) -> None:
        limit = self._links.link_max_frame_bytes
        direct = self._direct
        for dest, msg in out:
            if dest == "front":
                if direct is not None:
                    # The direct port's replies go straight to their clients.
                    rest = self._direct_out(direct, msg, block_on_front)
                    if rest is None:
                        continue
                    msg = rest
                # Blocking is the back-pressure the runtime contract asks for: a front end
                # that does not read stops this shard. While stopping, nobody may read.
                data, msg = self._pack_reply(msg)
                if len(data) > limit:
                    self._send_split(msg, block_on_front)
                else:
                    self._front.send(data, block=block_on_front)
            else:
                # Likewise a writer that does not read stops this shard. With the link down
                # the batch is dropped here and resent by `core.batches` when it is back.
                try:
                    data = pack(msg)
                except (TypeError, ValueError, OverflowError):
                    # Only the shard's own `muts` go to the writer.
                    data = pack(self.core.batches.salvage_batch(cast(msgs.MutsMsg, msg)))
                muts = msg.get("muts")
                ops = 0
                if isinstance(muts, list):
                    ops = len(muts)
                    self.core.batches.sized(msg["seq"], len(data))
                self._writer.send(data, urgent=self._rings_for(msg), ops=ops)
        if self._writer.pending > WRITER_BACKLOG_BYTES:
            self._wait_for_writer()

    def _pack_reply(self, msg: Mapping[str, Any]) -> tuple[bytes, Mapping[str, Any]]:
        """Pack a message for the front end, and the message the bytes stand for: if a reply
        cannot be packed (an integer past 64 bits ...), each reply is packed on its own and
        only the one at fault becomes an error."""
        pack_reply = self._front_packer.pack
        try:
            return pack_reply(msg), msg
        except (TypeError, ValueError, OverflowError):
            msg = salvage_replies(msg, pack_reply)
            return pack_reply(msg), msg

    def _send_split(self, msg: Mapping[str, Any], block: bool) -> None:
        """A reply batch over the link's frame limit goes out in several frames: the front end
        refuses (and drops the link on) a larger one."""
        frames, refused, unsent = self._front_packer.split(msg, self._links.link_max_frame_bytes)
        for conn, rid, size in refused:
            _log.warning("reply too large for the front-end link", conn=conn, rid=rid, size=size)
        for data in frames:
            self._front.send(data, block=block)
        if unsent:
            # Pulled but never sent: back to waiting, not active with no worker holding them.
            now = self.clock.now()
            self.core.give_back(unsent, now)
            self._send(self.core.finish_turn(now), block_on_front=block)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m shardq.runtime.shard --spec JSON`; returns the exit code."""
    try:
        spec = parse_spec_args(sys.argv[1:] if argv is None else argv)
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    configure("shard", spec.process.log_format, spec.process.log_level, spec.index)
    try:
        shard = ShardProcess(spec)
    except (zmq.ZMQError, OSError, ValueError) as e:
        _log.error("shard cannot start", error=str(e))
        return 1
    try:
        return shard.run()
    except Exception as e:
        _log.exception("shard failed")
        shard.sup.fatal(f"shard {spec.index}: {e}")
        return 1
    finally:
        shard.close()
