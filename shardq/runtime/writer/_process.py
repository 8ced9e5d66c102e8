"""The writer process: the only process that writes the SQLite file.

Run as `python -m shardq.runtime.writer --spec '<json>'` by the supervisor. It listens on
`spec.writer_link_path` (Unix stream links, `links._writer`) and takes `muts`, `flush` and
`sync` messages from the shards; it commits what it received as one `Storage.apply` per flush
(the policy is `_flush`) and confirms back on each shard's link with `done` (or `fail` while
the disk is full); the replies a committed durable batch carried go to the front end, whose
own connection to the listener says `front` (`_deliver`). See docs/runtime.md for the
messages. Shards send job records and changes msgpack-encoded inside the message
(`shardq.storage._encode`), so decoding a message decodes no job.

Idle-silent: with nothing waiting it blocks in `poll` with no timeout, and wakes for a message
or a signal only; but once after its start and after its last commit (`vacuum_idle_ms`
later), to give the file's free pages back a step at a time (`_vacuum`) while no message
waits.

Exit codes: 0 after a clean shutdown (or a recycle, `_recycle`); 1 if waiting mutations could
not be committed before the shutdown timeout (or a second SIGTERM); 2 for a bad command line;
3 if the database cannot be opened or the writer's socket cannot be bound.
"""

from __future__ import annotations

import gc
import logging
import math
import select
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import structlog
import zmq

from shardq.runtime import _messages as msgs
from shardq.runtime._giveback import IdleGiveBack, IdleGrowth
from shardq.runtime._signals import SignalWaker
from shardq.runtime._spec import ChildSpec
from shardq.runtime._spin import AUTO, AdaptiveSpin, auto_spin, spin_until
from shardq.runtime._spin import STATS as SPIN_STATS
from shardq.runtime.links._writer import ShardConnections
from shardq.runtime.writer._drain_pieces import DrainPieces
from shardq.runtime.writer._flush import FlushBuffer, Outgoing
from shardq.runtime.writer._idle import IdleTimers
from shardq.runtime.writer._pollset import PollSet
from shardq.runtime.writer._rebuild import rebuild_of
from shardq.runtime.writer._recycle import WriterRecycle
from shardq.runtime.writer._rejected import RejectedMutations
from shardq.runtime.writer._status import WriterStatus, file_sizes
from shardq.runtime.writer._vacuum import IdleVacuum
from shardq.storage import (
    Storage,
    StorageError,
    StorageFenced,
    StorageFull,
)

__all__ = ["Writer"]

EXIT_OK, EXIT_UNFLUSHED, EXIT_USAGE, EXIT_NO_DATABASE = 0, 1, 2, 3
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

log = structlog.get_logger()

# (message, shard, seq, now, frame size) -> whether the message was well formed.
_Handler = Callable[[dict[str, Any], int, int, float, int], bool]


def _debug_enabled() -> bool:
    """Whether the configured logger writes debug lines (the level is set once, at start)."""
    enabled = getattr(log.bind(), "is_enabled_for", None)
    return True if enabled is None else bool(enabled(logging.DEBUG))


class Writer(RejectedMutations):
    """Owns the storage and the shards' links; `run()` is the process's loop.

    The storage is any backend that meets `shardq.storage.Storage`; `main` opens the SQLite
    `Store`.

    Raises `OSError` from the constructor if the link socket cannot be bound. A shard learns
    that a (new) writer is up by connecting to it, and then resends what no writer confirmed.
    """

    def __init__(
        self,
        spec: ChildSpec,
        store: Storage,
        *,
        clock: Callable[[], float] = time.monotonic,
        vacuum: bool = True,
        on_recycle: Callable[[int], None] | None = None,
    ) -> None:
        self._spec = spec
        self._store = store
        self._clock = clock
        self._buffer = FlushBuffer(
            spec.writer.flush_interval_ms / 1000,
            spec.writer.flush_max_mutations,
            retry_max_s=spec.writer.storage_retry_max_ms / 1000,
            # What a shard may hold unsent for its writer, the writer may hold uncommitted.
            max_buffered_bytes=spec.links.writer_backlog_max_bytes,
        )
        # With bells, a pending group commit's buffered batches are read at its deadline, not
        # one wake-up each as they come (`links._writer`, `_lazy`).
        self._bells = spec.links.writer_lazy_read_bytes > 0
        self._muted: set[int] = set()  # links a buffered batch came over since the last flush
        # For the stop line: reads of a shard link that brought messages, and bells heard.
        self._link_reads = 0
        self._rings = 0
        self._links = ShardConnections(
            spec.writer_link_path, spec.writer_bell_path if self._bells else None
        )
        self._listener_fd = self._links.listener_fd()  # the listener's, for its whole life
        # With adaptive spinning the writer spins too, but it follows durable batches only:
        # they are the messages someone waits on; buffered ones wait for a flush anyway.
        process = spec.process
        self._spin: AdaptiveSpin | None = (
            auto_spin(
                process.spin_auto_max_us,
                process.spin_auto_max_runnable,
                process.spin_auto_cut_us,
                process.spin_auto_cut_turns,
            )
            if process.spin_us == AUTO
            else None
        )
        self._reading = True
        self._degraded = False
        # The HTTP process stats a SQLite file itself; PostgreSQL's size only the writer reads.
        sizer = store.database_bytes if spec.writer.storage_url else None
        self._status = WriterStatus(spec.run_dir, clock, sizer)
        settings = spec.writer
        self._vacuum = IdleVacuum(
            store,
            spec.data_path,
            self._status,
            # A file still without auto_vacuum (`convert_old_file`) has nothing a step frees.
            pages_per_step=settings.vacuum_pages_per_step if vacuum else 0,
            min_free_pages=settings.vacuum_min_free_pages,
            idle_s=settings.vacuum_idle_ms / 1000,
            step_s=settings.vacuum_step_ms / 1000,
            max_pages_per_step=settings.vacuum_max_pages_per_step,
            clock=clock,
            rebuild=rebuild_of(store, settings, clock),
            rebuild_idle_s=settings.vacuum_rebuild_idle_ms / 1000,
            max_free_pages=settings.vacuum_step_max_free_pages,
        )
        # A Drain's range, deleted between the batches (`_drain_pieces`).
        # On PostgreSQL, a range a takeover brings is looked for every lease round.
        look_s = spec.cluster.lease_ms / 3000 if settings.storage_url else None
        self._pieces = DrainPieces(store, self._status, max_rows=settings.drain_chunk_rows,
                                   piece_s=settings.drain_piece_ms / 1000, look_s=look_s,
                                   clock=clock)  # fmt: skip
        # Memory grown by a busy period (decoded batches, SQLite's page cache) goes back once
        # the writer is idle (`_giveback.py`).
        give_back = IdleGrowth.give_back(spec.process)
        self._give_back = IdleGiveBack(give_back, self._compact, clock=clock)
        # What the give-back cannot return, a fresh writer does (`_recycle.py`): on SQLite
        # only (on PostgreSQL the writer holds the node's partition leases).
        recycle = IdleGrowth.writer_recycle(spec.process)
        if on_recycle is None or settings.storage_url:
            recycle = IdleGrowth(idle_s=0)
        self._recycle = WriterRecycle(recycle, self._recycle_blocker)
        self._on_recycle = on_recycle
        self._idle = IdleTimers(self._vacuum, self._give_back, self._pieces, self._recycle, clock)
        # What the shards send: one handler per kind; False drops the message as malformed.
        self._handlers: dict[object, _Handler] = {
            msgs.MUTS: self._on_muts,
            msgs.SYNC: self._on_sync,
            msgs.FLUSH: self._on_flush,
            msgs.FRONT: self._on_front,
        }
        # (shard, seq) of the batches whose mutations the last flush refused (`rejected`).
        self._refused: set[tuple[int, int]] = set()
        self._poll_set = PollSet()
        # The poll set is worked out again only when this changes (`_poll`): the links'
        # generation, whether input is read, and while lazy, which links are left unread.
        self._poll_key: tuple[int, bool, int] = (-1, False, -1)
        self._muted_gen = 0  # counts the changes of `_muted`
        self._bell_fds: frozenset[int] = frozenset()  # as of the poll set
        # One packer for every confirmation: `msgpack.packb` builds a new one each call.
        self._pack = msgpack.Packer(use_bin_type=True).pack
        # Whether the per-commit debug line is written, asked once: a call on the module's
        # logger binds a new logger each time (3 µs) even when it then drops the line.
        self._debug = _debug_enabled()

    @property
    def buffer(self) -> FlushBuffer:
        """The flush buffer (read-only use: for tests and metrics)."""
        return self._buffer

    def run(self, waker: SignalWaker) -> int:
        """Serve until SIGTERM/SIGINT, then flush, checkpoint and return the exit code."""
        waker_fd = waker.fileno()
        buffer, clock = self._buffer, self._clock
        while True:
            events = self._poll(waker_fd)
            if waker_fd in events and _stop_requested(waker.drain()):
                break
            with _no_collection:
                self._serve_links(events)
                deadline = buffer.deadline()  # `due`, without its call
                if deadline is not None and clock() >= deadline:
                    if self._muted:
                        self._read_links(events)  # what waited unread for this commit
                    self._flush()
            if self._after_turn(events, waker_fd):
                break
        return self._shutdown(waker)

    def _after_turn(self, events: dict[int, int], waker_fd: int) -> bool:
        """What a turn does once its batches are read and committed: a piece of a Drain's
        range, then whatever of the idle timers is due (`_idle`: the vacuum, the memory
        give-back, the recycle), with one compare when none is. True: the writer recycles.
        Nobody waits on these; a commit's confirmation is already out."""
        now = self._clock()
        idle = self._idle
        if self._pieces.wanted and not self._buffer.due(now):
            self._pieces.step()  # one piece, then the links again (`_timeout_ms` 0)
            idle.at = 0.0  # a range done: the next look's deadline is to be worked out
            now = self._clock()
        if not idle.armed and len(events) > (waker_fd in events):  # a link's event
            idle.arm(now)
        if now < idle.at:
            return False
        # Idle: no batch waits, nor a retry (a message that came this turn made a batch).
        return self._recycling(idle.turn(now, self._buffer.deadline() is not None))

    def _recycling(self, rss: int | None) -> bool:
        """Whether the writer stops now to be replaced by a fresh process (`_recycle.py`):
        the supervisor is told before the loop ends."""
        if rss is None or self._on_recycle is None:
            return False
        log.info("writer recycling", rss_mb=round(rss / 2**20, 1),
                 limit_mb=round(self._recycle.limit / 2**20, 1),
                 fresh_mb=round(self._recycle.fresh_bytes / 2**20, 1))  # fmt: skip
        self._on_recycle(rss)
        return True

    def _recycle_blocker(self) -> str | None:
        """What keeps the writer from recycling now (None: nothing): work waiting, or
        confirmations a shard has not taken yet."""
        if self._buffer.pending_batches or self._buffer.deadline() is not None:
            return "batches waiting"
        # A pass under way, not one merely wanted: every commit makes one wanted for when
        # the writer is next idle, and the new writer starts with one wanted (a steady
        # trickle of commits would otherwise hold the recycle off for good).
        if self._vacuum.under_way:
            return "vacuum pass under way"
        if self._pieces.wanted or self._pieces.deadline() is not None:
            return "drain range waiting"
        if self._links.waiting_fds():
            return "replies not sent"
        return None

    def close(self) -> None:
        """Close the links. Unsent confirmations are dropped: the writer stops after the
        shards (docs/runtime.md), so nobody is left to read them."""
        self._links.close()

    # -- the loop

    def _poll(self, waker_fd: int) -> dict[int, int]:
        # The poll set is kept while its key stays the same (`_pollset`): connections come
        # and go, and input is not read at all while the buffer is full (storage failing),
        # so the shards' blocking sends push back.
        reading = self._buffer.accepting
        lazy = self._lazy() if reading and self._muted else False
        key = (self._links.generation, reading, self._muted_gen if lazy else -1)
        if key != self._poll_key:
            self._poll_key = key
            self._watch(waker_fd, reading, lazy)
        poller = self._poll_set.poller
        timeout = self._timeout_ms()
        spin = self._spin
        if spin is not None and timeout != 0 and (spin_s := spin.window(time.perf_counter())):
            got = spin_until(
                lambda: poller.poll(0), spin_s, spin.cut_s, spin.cut_turns, spin.crowded
            )
            return dict(got or poller.poll(timeout))
        return dict(poller.poll(timeout))

    def _watch(self, waker_fd: int, reading: bool, lazy: bool) -> None:
        """Register what the writer waits on now (`_poll`, when its key changed)."""
        self._bell_fds = self._poll_set.watch_links(
            self._links, waker_fd, self._listener_fd, reading, self._muted if lazy else ()
        )
        if reading != self._reading:
            self._reading = reading
            if not reading:
                log.warning(
                    "writer buffer full; shards are blocked until storage recovers",
                    waiting_mutations=self._buffer.pending,
                )

    def _lazy(self) -> bool:
        """Whether to leave the links unread until the pending commit's deadline: only with
        bells (a shard wakes the writer for what it must read now), and only for a group
        commit's wait, not once it is due nor during a failing commit's backoff."""
        if not self._bells or self._buffer.failures:
            return False
        deadline = self._buffer.deadline()
        return deadline is not None and deadline > self._clock()

    def _serve_links(self, events: dict[int, int]) -> None:
        links = self._links
        bells = self._bell_fds
        listener = self._listener_fd
        rang = False
        for fd, mask in events.items():
            if fd == listener:
                self._muted.difference_update(links.accept())  # a closed link's descriptor
                continue
            if fd in bells:
                rang = links.heard(fd) or rang
                continue
            if mask & select.POLLOUT:
                links.writable(fd)
            if mask & ~select.POLLOUT and self._buffer.accepting:
                self._read(fd)
        if rang:
            self._rings += 1
            self._read_links(events)

    def _read_links(self, events: dict[int, int]) -> None:
        """Read the links left unread while `_lazy` (`_muted`) that this turn did not read."""
        for fd in list(self._muted):
            if events.get(fd, 0) & ~select.POLLOUT or not self._buffer.accepting:
                continue  # read this turn already
            self._read(fd)

    def _read(self, fd: int) -> None:
        frames = self._links.readable(fd)
        if frames:
            self._link_reads += 1
        for conn, frame in frames:
            self._handle(frame, conn)

    def _compact(self) -> tuple[()]:
        """What the writer gives back besides the collection: SQLite's page cache."""
        try:
            self._store.release_memory()
        except StorageError as e:  # only memory was at stake: the next batch will tell
            log.warning("could not release the store's memory", error=str(e))
        return ()

    def _timeout_ms(self) -> int | None:
        if self._pieces.wanted:
            return 0
        deadline = self._buffer.deadline()
        if deadline is None:
            deadline = self._idle.at  # the idle timers' earliest (`_idle`)
            if deadline == math.inf:
                return None  # nothing waits: sleep until a message or a signal
        wait = math.ceil((deadline - self._clock()) * 1000)
        return wait if wait > 0 else 0

    def _handle(self, frame: bytes, conn: int) -> None:
        try:
            message = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException) as e:  # TypeError: unhashable key
            log.error("dropped an undecodable message", error=str(e), size=len(frame))
            return
        if not isinstance(message, dict):
            log.error("dropped a message that is not a map", kind=type(message).__name__)
            return
        kind, shard, seq = message.get("t"), message.get("shard"), message.get("seq")
        now = self._clock()
        # Plain ints only (a bool is not a seq): what msgpack decodes, checked without a call.
        if type(shard) is not int or type(seq) is not int:
            log.error("dropped a message without shard and seq", kind=kind)
            return
        self._links.claim(conn, shard)
        handler = self._handlers.get(kind)
        if handler is None or not handler(message, shard, seq, now, len(frame)):
            log.error("dropped a malformed message", kind=kind, shard=shard, seq=seq)

    def _on_muts(
        self, message: dict[str, Any], shard: int, seq: int, now: float, size: int
    ) -> bool:
        muts = message.get("muts")
        if not isinstance(muts, list):
            return False
        urgent = message.get("durable") is True
        if urgent and self._spin is not None:
            self._spin.note(time.perf_counter())
        rep = message.get("rep")
        rep = rep if urgent and type(rep) is bytes else None
        added = self._buffer.add_muts(shard, seq, muts, now, urgent=urgent, nbytes=size, rep=rep)
        fd = self._links.fd_of(shard) if self._bells and not urgent else None
        if fd is not None and fd not in self._muted:
            self._muted.add(fd)
            self._muted_gen += 1
        if added:  # a `fail` at once while storage is full; nothing otherwise
            self._send(added)
        return True

    def _on_front(
        self, message: dict[str, Any], shard: int, seq: int, now: float, size: int
    ) -> bool:
        # `_handle` claimed the connection for FRONT_END_SHARD: committed durable replies
        # go there from now on (`_deliver`).
        return shard == msgs.FRONT_END_SHARD

    def _on_sync(
        self, message: dict[str, Any], shard: int, seq: int, now: float, size: int
    ) -> bool:
        self._send(self._buffer.add_sync(shard, seq, now))
        return True

    def _on_flush(
        self, message: dict[str, Any], shard: int, seq: int, now: float, size: int
    ) -> bool:
        self._buffer.urge()
        return True

    def _flush(self) -> bool:
        """Commit everything waiting as one transaction; True if it committed."""
        buffer = self._buffer
        started = self._clock()
        self._refused.clear()
        if self._muted:  # its shards read their `done` before leaving a link unread again
            self._muted.clear()
            self._muted_gen += 1
        try:
            rows = self._commit(buffer.mutations())
        except StorageFenced as e:
            # Retrying fails the same way: the partitions are another node's now.
            log.error("batch refused: this node no longer holds its partitions (fenced)",
                      error=str(e), dropped_mutations=buffer.pending,
                      partitions=list(e.lost[:20]))  # fmt: skip
            self._send(buffer.dropped(f"partition moved: {e}"))
            return False
        except StorageError as e:
            self._status.failed(str(e), disk_full=isinstance(e, StorageFull))
            self._send(buffer.failed(e, self._clock()))
            self._report_failure(e)
            return False
        ended = self._clock()
        took = ended - started
        pending, batches = buffer.pending, buffer.pending_batches
        failures, failing_since = buffer.failures, buffer.failing_since
        drains = buffer.drains  # `committed` (in `_deliver`) clears it
        # Whoever waits on this commit (a durable push's client) hears of it first; the
        # bookkeeping below (status file, vacuum clock, logs) is nobody's wait.
        self._deliver(buffer)
        self._store.settle()  # the row cache's update, off the durable pushes' wait
        if failures:
            log.info(
                "storage recovered",
                attempts=failures + 1,
                failing_for_ms=round((self._clock() - (failing_since or started)) * 1000),
                mutations=pending,
            )
            self._degraded = False
        self._status.flushed(pending, took)
        vacuum_at = self._vacuum.committed(ended)  # a wait's start: a moment early is as good
        if vacuum_at is not None and vacuum_at < self._idle.at:
            self._idle.at = vacuum_at
        self._pieces.committed(drains)
        if self._debug:
            log.debug("flushed", mutations=pending, batches=batches, rows=rows,
                      ms=round(took * 1000, 2))  # fmt: skip
        return True

    def _deliver(self, buffer: FlushBuffer) -> None:
        """Confirm the commit to the shards, then hand the durable replies it settles to
        the front end (one hop less than through their shard). The `done` goes first, so a
        shard has it before a client that got its reply can ask that shard for the job; it
        names the batches whose replies follow (`answered`), so their shard drops its copy.
        Only while the front end's link is connected and keeping up: otherwise the shards
        answer, as they always can."""
        front = msgs.FRONT_END_SHARD
        replies = buffer.replies(self._refused) if self._links.idle(front) else []
        if not replies:  # the usual case: the shards answer their own (a handed-off link)
            self._send(buffer.committed())
            return
        answered: dict[int, list[int]] = {}
        for shard, seq, _rep in replies:
            answered.setdefault(shard, []).append(seq)
        self._send(buffer.committed(answered))
        for _shard, _seq, rep in replies:
            self._links.send(front, rep)

    def _report_failure(self, error: StorageError) -> None:
        buffer = self._buffer
        fields: dict[str, Any] = {
            "error": str(error),
            "waiting_mutations": buffer.pending,
            "waiting_batches": buffer.pending_batches,
            "retry_in_ms": round(buffer.retry_in(self._clock()) * 1000),
        }
        if isinstance(error, StorageFull):
            if not self._degraded:  # once per episode; the retries are not news
                fields.update(file_sizes(self._spec.data_path))  # what fills the disk
                log.error("storage full: durable writes fail until space is freed", **fields)
            self._degraded = True
        elif buffer.failures == 1 or buffer.retry_in(self._clock()) >= 1.0:
            # The first failure, then only the slow retries: at most one line a second.
            log.warning("flush failed; retrying", attempt=buffer.failures, **fields)

    def _send(self, messages: Sequence[Outgoing]) -> None:
        for shard, message in messages:
            # Never blocks: what does not fit waits in the link's buffer. A confirmation is
            # cumulative, so one for a shard that is not connected (it died) is simply dropped.
            self._links.send(shard, self._pack(message))

    # -- shutdown

    def _shutdown(self, waker: SignalWaker) -> int:
        deadline = self._clock() + self._spec.process.shutdown_timeout_ms / 1000
        log.info("writer stopping", waiting_mutations=self._buffer.pending,
                 link_reads=self._link_reads, rings=self._rings, **SPIN_STATS.fields())  # fmt: skip
        self._vacuum.stop()  # a rebuild's copy would hold the final checkpoint back
        while True:
            self._drain_everything()
            if self._buffer.pending_batches == 0 or self._flush():
                break
            now = self._clock()
            wait_s = min(self._buffer.retry_in(now), deadline - now)
            if wait_s <= 0 or _wait_for_signal(waker, wait_s):
                log.error(
                    "writer stopped with mutations not committed",
                    lost_mutations=self._buffer.pending,
                    lost_batches=self._buffer.pending_batches,
                )
                return EXIT_UNFLUSHED
        try:
            # Without waiting for readers: a reader that still holds a snapshot (a backup, an
            # operator's query) would hold the exit up for the whole busy timeout (5 s). The
            # copy itself is bounded by the WAL SQLite keeps between its own checkpoints; a
            # partial one is finished by the next open's first checkpoint.
            complete = self._store.checkpoint(wait=False)
        except StorageError as e:
            log.warning("WAL checkpoint failed", error=str(e))
        else:
            log.info(
                "writer stopped",
                wal_checkpoint="complete" if complete else "partial",
                **file_sizes(self._spec.data_path),
            )
        return EXIT_OK

    def _drain_everything(self) -> None:
        # The shards have stopped by now; whatever they sent last is already in our sockets.
        links = self._links
        links.accept()
        for fd in links.conn_fds():
            while frames := links.readable(fd):
                for conn, frame in frames:
                    self._handle(frame, conn)


class _NoCollection:
    """Keep the cyclic garbage collector out of reading and flushing a batch.

    Decoding and applying a batch build a few container objects per mutation that all die when
    the flush ends. A young collection in the middle walks every one still alive and promotes
    them to be walked again: 10-13 % of the writer's CPU. None of them forms a cycle, so
    collections wait until the turn is over; the allocation count they run on carries over.

    One instance serves every turn (`_no_collection`), not nested: a plain class, where a
    generator-based context manager cost five more Python calls a turn.
    """

    __slots__ = ("_was_enabled",)

    def __init__(self) -> None:
        self._was_enabled = False

    def __enter__(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *_exc: object) -> None:
        if self._was_enabled:
            gc.enable()


_no_collection = _NoCollection()


def _stop_requested(signals: list[int]) -> bool:
    return any(signum in _STOP_SIGNALS for signum in signals)


def _wait_for_signal(waker: SignalWaker, seconds: float) -> bool:
    """Sleep up to `seconds`; True if a stop signal arrived meanwhile (a second SIGTERM)."""
    poller = zmq.Poller()
    poller.register(waker.fileno(), zmq.POLLIN)
    if poller.poll(max(0, math.ceil(seconds * 1000))):
        return _stop_requested(waker.drain())
    return False
