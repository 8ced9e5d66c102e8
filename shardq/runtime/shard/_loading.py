"""A shard's loading: its queues and jobs at the start, and (several nodes on one database) the
partitions it gains or drops while running (`shard._takeover`).

`ShardLoading` is a part of `ShardProcess` (`shard._process`), kept in a module of its own; it
reads the attributes it names below, which the process sets.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import structlog

from shardq.cluster._map import held_pairs
from shardq.core._handover import forget_queues
from shardq.runtime import _messages as msgs
from shardq.runtime._child import SupervisorLink
from shardq.runtime._routing import shard_of
from shardq.runtime._spec import ChildSpec
from shardq.runtime._storage import open_storage
from shardq.runtime.links._control import pack
from shardq.runtime.links._stream import FrontLink
from shardq.runtime.shard._backlog import StoreBacklog
from shardq.runtime.shard._core import ShardCore
from shardq.runtime.shard._progress import Progress
from shardq.runtime.shard._takeover import Holdings, initial_partitions
from shardq.storage import Storage
from shardq.storage._cold_reads import ColdCounts

__all__ = ["ShardLoading"]

_log = structlog.get_logger()


class ShardLoading:
    """Loading a shard's queues and jobs, at the start and on a change of partitions."""

    spec: ChildSpec
    core: ShardCore
    sup: SupervisorLink
    _front: FrontLink
    _backlog: StoreBacklog | None
    _holdings: Holdings | None
    _report_at: int | None
    _send: Callable[..., None]
    _stop_asked: Callable[[], bool]

    def _recover(self, now: int) -> tuple[int, int, int]:
        """Load this shard's stored queues and jobs; return (jobs, queues, recovery mutations).

        Opens the configured store (`open_storage`); opening runs no migration here (the
        writer already did).
        The collector is off meanwhile: every object made is kept, so it would only walk them.
        """
        gc.disable()
        try:
            with self._storage() as store:
                return self._load(store, now)
        finally:
            gc.enable()

    def _storage(self) -> AbstractContextManager[Storage]:
        """The store to load from: under a head budget the backlog's (kept open after),
        otherwise one opened for the load and closed after it (a memory budget that has not
        installed the head loads as without one: on PostgreSQL, loads of gained partitions
        through the kept connection made a takeover mid-flow time out, test_flow_nodes)."""
        if self._backlog is not None and self.core.engine.head is not None:
            return nullcontext(self._backlog.store)
        return open_storage(self.spec, capped=False)

    def _load(
        self, store: Storage, now: int, parts: frozenset[int] | None = None
    ) -> tuple[int, int, int]:
        """Load from `store` what this shard owns (see `_recover` for the return value): at
        start, the queues of this node's partitions; with `parts`, those of these partitions
        only (partitions this node gained, `_on_parts`), into the running engine.

        Only what the engine will hold is read: the jobs of this shard's queues, and of their
        completed jobs only the newest `max_completed` (the store filters, so the other rows
        are never decoded). Records stream from the store one page at a time, in seq order,
        straight into the engine. Completed rows beyond the window (left by a version that
        kept them on disk) are deleted. Progress goes to the log and the supervisor every
        second. A stop asked while a starting shard loads ends the load (`LoadStopped`):
        nothing it did is sent, as if the shard had been killed there.
        """
        starting = parts is None
        progress = Progress(self.sup, self._stop_asked) if starting else Progress(None)
        progress.beat()
        # A single statement can outlast `ready_timeout_ms` on a big store: beat inside it too.
        store.set_progress(progress.tick)
        try:
            return self._load_with(store, now, parts, progress)
        finally:
            store.set_progress(None)

    def _load_with(
        self, store: Storage, now: int, parts: frozenset[int] | None, progress: Progress
    ) -> tuple[int, int, int]:
        """`_load`'s reads, `progress` counting them."""
        spec = self.spec
        starting = parts is None
        mine = self._owner(parts)
        names = {n for n in store.queue_names() if mine(n)}
        queues = {n: cfg for n, cfg in store.load_queues().items() if n in names}
        progress.mark("queues")
        floor = store.completed_floor(self.core.engine.config.max_completed, names)
        progress.mark("completed_floor")
        engine = self.core.engine
        paging = engine.head is not None or engine.memory is not None
        # Under a head or memory budget the cold waiting and delayed jobs stay in storage
        # (paged in). A memory budget installs the head before the jobs are restored if
        # storage holds any (it had passed the budget): the restore watches cold-marked rows.
        started = time.monotonic()
        counts = {name: store.cold_counts(name) for name in sorted(names)} if paging else {}
        progress.mark("cold_counts")
        if engine.memory is not None:
            engine.memory.prepare(counts)
        records = store.load_jobs(queues=names, completed_from=floor, hot_only=paging)
        # By shard, not by `names`: a schedule's queue may hold no job or config yet.
        crons = [c for c in store.load_crons() if mine(c["queue"])]
        # Shard 0 owns the webhook registry (shardq.core._webhooks); they belong to no queue.
        hooks = store.load_webhooks() if spec.index == 0 and starting else []
        own = (rec for rec in records if mine(rec["queue"]))
        recovered = self.core.recover(progress.count(own), queues, now, crons, hooks)
        progress.mark("load_jobs")
        if paging:
            recovered += self._restore_cold(store, counts, now, started)
            progress.mark("restore_cold")
        outbox = store.load_flow_outbox()
        self.core.engine.flows.load_outbox(n for n in outbox if mine(n["cq"]))
        if floor is not None and starting:  # a gained partition's were its owner's
            recovered += self._delete_stale(store.stale_completed(floor, names), now)
        progress.mark("outbox_and_stale")
        _log.info("shard load steps", **{f"{k}_ms": v for k, v in progress.steps.items()})
        return progress.loaded, len(queues), recovered

    def _restore_cold(
        self, store: Storage, counts: Mapping[str, ColdCounts], now: int, started: float
    ) -> int:
        """Under a head or memory budget: each queue's cold counts to the engine, which pages
        its heads in. Returns the mutations that made (hot jobs sorting after a head go cold)."""
        made = self.core.restore_cold(counts, now, store.max_seq())
        cold = sum(c.waiting + c.delayed for c in counts.values())
        if not cold and self.core.engine.head is None:
            return made  # a memory budget never passed: nothing cold, no head
        _log.info("cold backlog restored", queues=len(counts), cold_jobs=cold,
                  head_jobs=self.core.head_jobs(), mutations=made,
                  ms=round((time.monotonic() - started) * 1000))  # fmt: skip
        return made

    def _owner(self, parts: frozenset[int] | None) -> Callable[[str], bool]:
        """The test of a queue name this load keeps: this shard's (the store filters by
        queue already, except past `MAX_FILTER_QUEUES` queues), and on a node of several,
        in `parts` (at start: the partitions the lease thread's map says the node holds)."""
        holdings = self._holdings
        if holdings is None:
            shards, index = self.spec.shards, self.spec.index
            return lambda name: shard_of(name, shards) == index
        if parts is None:
            holdings.held = initial_partitions(self.spec.run_dir)
            parts = frozenset(holdings.held)
        return holdings.owns(parts)

    def _on_parts(self, msg: dict[str, Any], now: int) -> None:
        """The front end says which partitions this node holds now: drop the queues of those
        it lost, load those of the ones it gained, and say what this shard holds now."""
        holdings = self._holdings
        assert holdings is not None  # the hook is set only with holdings
        held = held_pairs(msg)
        if not held and msg.get("held"):
            _log.warning("malformed parts message dropped")
            return
        gained, lost = holdings.change(held)
        if lost:
            started = time.monotonic()
            engine = self.core.engine
            # A schedule's queue may hold no job or config yet: its name counts too, or the
            # schedule would stay here and fire on this node as well as on the new owner.
            crons = [str(rec.get("queue")) for rec in engine.cron.schedules.values()]
            names = holdings.queues_of([*engine.queues, *crons], lost)
            jobs = forget_queues(self.core.engine, names)
            self.core.release_moved_waits()
            _log.info("partitions dropped", partitions=len(lost), queues=len(names), jobs=jobs,
                      ms=round((time.monotonic() - started) * 1000))  # fmt: skip
        if gained:
            self._load_gained(gained, now)
        self._send(self.core.finish_turn(now))
        self._report_at = self.core.seq
        self._report_loaded()

    def _report_loaded(self) -> None:
        """Say what this shard holds once the writer confirmed all it was sent before."""
        if self._report_at is None or self.core.batches.committed < self._report_at:
            return
        self._report_at = None
        assert self._holdings is not None
        self._front.send(pack(msgs.loaded(self.spec.index, *self._holdings.pairs())))

    def _load_gained(self, gained: frozenset[int], now: int) -> None:
        """Load the gained partitions' queues; a failure leaves them out of `held` (the front
        end keeps refusing them) until the next `parts` message tries again."""
        started = time.monotonic()
        gc.disable()
        try:
            with self._storage() as store:
                jobs, queues, recovered = self._load(store, now, gained)
        except Exception as e:
            assert self._holdings is not None
            for part in gained:
                self._holdings.held.pop(part, None)
            _log.error("loading gained partitions failed", partitions=len(gained), error=str(e))
            return
        finally:
            gc.enable()
        _log.info("partitions loaded", partitions=len(gained), queues=queues, jobs=jobs,
                  recovery_mutations=recovered,
                  ms=round((time.monotonic() - started) * 1000))  # fmt: skip

    def _delete_stale(self, pages: Iterator[list[str]], now: int) -> int:
        """Delete stored completed rows the engine did not load, one page per batch."""
        deleted = 0
        for keys in pages:
            self.core.forget_rows(keys)
            self._send(self.core.finish_turn(now))
            deleted += len(keys)
            self.sup.progress(deleted=deleted)
        if deleted:
            _log.info("stale completed rows deleted", rows=deleted)
        return deleted
