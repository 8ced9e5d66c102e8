"""One shard's message handling, turn by turn, with no sockets and no clock.

The shard process (`shard/_process.py`) is a thin shell around `ShardCore`: each loop turn it feeds
every message it drained with `handle(msg, now)`, then calls `finish_turn(now)`, sends what
that returns, and calls `after_send()`. One turn yields at most one `muts` message to the writer
(group commit) and one `rep` batch to the front end.

Things the engine does not do and the shard adds (docs/runtime.md):
- durable pushes: their ok reply is held until the writer's `done` covers the turn's seq; their
  jobs are held from delivery until then too, and released once the replies the `done` freed
  are sent (`after_send`), or before anything else needs them: a request, or a parked
  long-poll at the turn's end;
- long-poll PULL/PULLB: parked per queue until work arrives there or the timeout passes;
- WaitJob: parked until the job completes or the timeout passes;
- Stats: this shard's counts, which the front end sums over all shards;
- drain mode: no job is handed out any more; `drained` is reported once nothing is active.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeAlias

import structlog

from shardq.core import FLOW_NOTIFY, FLOW_RELEASE, Engine, Mutation, Record, job_id_of
from shardq.protocol import INTERNAL_SERVER_ERROR
from shardq.protocol._rawpush import decode_raw_pushb, raw_refused
from shardq.runtime import _messages as msgs
from shardq.runtime._sections import LinkSettings
from shardq.runtime.links._stream import MAX_FRAME_BYTES
from shardq.runtime.shard._commands import (
    MAY_BE_DURABLE,
    empty_pull_reply,
    is_durable,
    push_run,
)
from shardq.runtime.shard._connections import ConnectionsAndDrain
from shardq.runtime.shard._events import EventTap
from shardq.runtime.shard._flows import FlowRelay
from shardq.runtime.shard._memory import TRIM_EVERY_MS, BudgetCheck, release_memory
from shardq.runtime.shard._parked import ParkedRequests
from shardq.runtime.shard._runs import CommandRuns
from shardq.runtime.shard._stats import shard_stats
from shardq.runtime.shard._waits import JobWaits, LongPolls, note_wakeups
from shardq.runtime.shard._writer_batches import Item, WriterBatches

__all__ = ["Outgoing", "ShardCore", "empty_pull_reply"]

Outgoing: TypeAlias = tuple[str, Mapping[str, Any]]
"""A message to send: ("writer" | "front", message map)."""

Envelope: TypeAlias = msgs.ReqEnvelope | None
OwnCommand: TypeAlias = Callable[[str, int, dict[str, Any], int, Envelope], dict[str, Any] | None]

STALLED_ERROR: Final = "Storage unavailable: the writer is not keeping up (storage degraded)"
MAX_SLEEP_MS: Final = 3_600_000  # the longest poll: an idle shard wakes once an hour at most
TICK_RETRY_MS: Final = 1_000  # after a timer pass raised, wait this long before the next one
# The defaults of `writer_batch_max_bytes` and `writer_batch_max_mutations` (`LinkSettings`).
BATCH_MAX_BYTES: Final = LinkSettings().writer_batch_max_bytes
BATCH_MAX_MUTATIONS: Final = LinkSettings().writer_batch_max_mutations
# Room a `muts` message needs beyond its mutations (its map, kind, shard, seq, flags).
_MESSAGE_ROOM: Final = 1024


_log = structlog.get_logger()


class ShardCore(ParkedRequests, ConnectionsAndDrain):
    """The request side of one shard: engine, durable holds, long-polls, WaitJob, drain."""

    def __init__(
        self,
        index: int,
        engine: Engine,
        *,
        flow_resend_ms: int = 1_000,
        batch_max_bytes: int = BATCH_MAX_BYTES,
        batch_max_mutations: int = BATCH_MAX_MUTATIONS,
        frame_max_bytes: int = MAX_FRAME_BYTES,
        memory_trim_ms: int = TRIM_EVERY_MS,
    ) -> None:
        """`batch_max_bytes` and `batch_max_mutations` bound each `muts` message to the
        writer; `frame_max_bytes` is the largest frame the writer takes: a mutation that
        cannot fit one is refused to its client (`WriterBatches._refuse_too_large`);
        `memory_trim_ms` is `[process] shard_memory_trim_ms` (`_memory.BudgetCheck`)."""
        self.index = index
        self.engine = engine
        self.flows = FlowRelay(index, engine, flow_resend_ms)
        self.draining = False
        # Set by the process while the writer has left this shard's batches unread for longer
        # than `storage_stall_ms`: durable pushes are refused at once (docs/runtime.md).
        self.storage_stalled = False
        self._drained_sent = False
        self._muts: list[Mutation] = []
        # Replies ready to go, and queues whose parked long-polls may be served now: one list
        # and one set for the shard's life, which `self.batches` fills too.
        self._replies: list[Item] = []
        # This turn's `Outcome.cancels`, sent after the batch that dead-letters their jobs.
        self._cancels: list[dict[str, Any]] = []
        self._woken: set[str] = set()
        self._durable: list[Item] = []
        # Finished segments of this turn: (durable, mutations, durable replies, held job
        # ids), see `_cut`.
        self._segments: list[tuple[bool, list[Mutation], list[Item], list[str]]] = []
        self._durable_ids: list[str] = []  # the current segment's held jobs
        self._seg_durable = False  # whether the current segment's mutations are durable
        # The batches sent to the writer, what waits on their commit, the writer's answers.
        self.batches = WriterBatches(
            index,
            engine,
            replies=self._replies,
            woken=self._woken,
            absorb=self._absorb,
            batch_max_bytes=batch_max_bytes,
            batch_max_mutations=batch_max_mutations,
            hard_max_bytes=frame_max_bytes - _MESSAGE_ROOM,
        )
        self._tick_after = 0  # no timer pass before this time (ms): the last one raised
        # Under a memory budget, its check after each turn (`_memory.BudgetCheck`).
        self._budget = BudgetCheck(index, engine, self._absorb, trim_every_ms=memory_trim_ms)
        self._finished: set[str] = set()
        self.polls = LongPolls()
        engine.cron.workers.pull_waiting = self.polls.waiting_on  # a parked pull is a worker too
        self.waits = JobWaits()
        self.event_tap = EventTap()  # job events, built only while the front end listens
        # Consecutive PUSHes of one queue, and consecutive ACKs, in one pass each.
        self._runs = CommandRuns(engine, self.event_tap, self._absorb, self._replies)
        # This shard's direct port's counts for Stats (`DirectPort.stats`), None while it has
        # none.
        self.direct_stats: Callable[[], dict[str, Any]] | None = None
        # The commands the shard answers itself rather than the engine: one lookup per request.
        self._own_commands: dict[object, OwnCommand] = {
            "PULL": self._pull,
            "PULLB": self._pull,
            "WaitJob": self._wait_job,
            "Stats": self._stats_command,
            "CompactMemory": self._compact_memory,
            FLOW_NOTIFY: self._flow_command,
            FLOW_RELEASE: self._flow_command,
        }
        self._handlers: dict[str, Callable[[dict[str, Any], int], None]] = {
            msgs.REQ: self._on_req,
            msgs.CLOSE: self._on_close,
            msgs.UNPARK: lambda msg, now: self.unpark(str(msg.get("conn"))),
            msgs.CANCEL_FOR: self._on_cancel_for,
            msgs.DONE: self.batches.on_done,
            msgs.FAIL: self.batches.on_fail,
            msgs.REJECTED: self.batches.on_rejected,
            msgs.DRAIN: self._on_drain,
            msgs.WRITER_UP: self.batches.on_writer_up,
            msgs.LISTEN: lambda msg, now: self.event_tap.listen(msg),
            msgs.WORKERS: lambda msg, now: self.engine.cron.workers.set_worker_queues(
                msg.get("queues")
            ),
            msgs.FLOWACK: self._on_flowack,
            msgs.PARTS: self._on_parts,
            msgs.RECYCLE_GO: self._on_recycle_go,
        }
        # The process's hook for `recycle-go` (`shard._recycle`): whether it stops after this
        # turn (False: something it holds forbids it now, and it carries on).
        self.recycle_hook: Callable[[], bool] | None = None
        # The process's hook for `parts` (it loads from the store, which the core never
        # touches): called with the message, which it checks.
        self.parts_hook: Callable[[dict[str, Any], int], None] | None = None

    # -- inputs ----------------------------------------------------------------------------

    def handle(self, msg: dict[str, Any], now: int) -> None:
        """Take one internal message. Never raises: a malformed message is logged and dropped."""
        if self.batches.confirm_pending:
            # Committed jobs become deliverable before any message that could ask for them.
            self.batches.confirm_committed()
        handler = self._handlers.get(msg.get("t"))  # type: ignore[arg-type]
        if handler is None:
            _log.warning("unknown internal message dropped", t=msg.get("t"))
            return
        self.event_tap.now = now
        try:
            handler(msg, now)
        except Exception:
            # Requests have their own guard (`_request`); this is for the rest (a close, the
            # writer's answers): one bad message must not take the shard's queues down.
            _log.exception("internal message failed", t=msg.get("t"))

    def _on_cancel_for(self, msg: dict[str, Any], now: int) -> None:
        """Cancels of jobs another shard holds, for connections handed off here: sent out
        as this shard's own (`_notices`), so the direct port writes each to its connection
        (`HandedWork.push_cancels`) and the front end gets back those it does not hold."""
        items = msg.get("items")
        if type(items) is list:
            self._cancels.extend(item for item in items if type(item) is dict)

    def recover(
        self,
        records: Iterable[Record],
        queues: Mapping[str, Any],
        now: int,
        crons: Iterable[Record] = (),
        webhooks: Iterable[Record] = (),
    ) -> int:
        """Load stored records (and cron schedules) into the engine; return how many recovery
        mutations it made.

        The mutations go out with the next `finish_turn`. Raises what `Engine.restore` raises.
        """
        muts = self.engine.restore(records, queues, now, crons=crons, webhooks=webhooks)
        self._muts.extend(muts)
        return len(muts)

    def restore_cold(self, counts: Mapping[str, Any], now: int, max_seq: int) -> int:
        """Under a head budget, after `recover`: the queues' cold counts (`cold_counts` of the
        store) and its highest seq to the engine's head; return how many mutations that made
        (they go out with the next `finish_turn`)."""
        memory, head = self.engine.memory, self.engine.head
        if memory is not None:
            muts = memory.restore_cold(counts, now, max_seq=max_seq)
        elif head is not None:
            muts = head.restore_cold(counts, now, max_seq=max_seq)
        else:
            return 0
        self._muts.extend(muts)
        return len(muts)

    def head_jobs(self) -> int:
        """The per-queue head size in force (0: every job in memory)."""
        head = self.engine.head
        return head.budget if head is not None else 0

    def forget_rows(self, row_keys: Iterable[str]) -> None:
        """Delete stored job rows the engine never loaded (recovery's stale completed rows);
        the deletions go out with the next `finish_turn`."""
        self._muts.extend(("del", key) for key in row_keys)

    def poll_timeout(self, now: int) -> int | None:
        """Milliseconds until something is due (timer, long-poll, WaitJob), None for never."""
        # Once per turn: a source is asked only when it holds something (its heap of parked
        # requests, answered ones included, or its due notices), and no list is built.
        due = self.engine.next_deadline()
        if due is not None and due < self._tick_after:
            due = self._tick_after
        for parked in (self.polls, self.waits):
            if parked.deadlines:
                at = parked.next_deadline()
                if at is not None and (due is None or at < due):
                    due = at
        if self.flows.due:
            at = self.flows.next_deadline()
            if at is not None and (due is None or at < due):
                due = at
        if due is None:
            return None
        # Clamped: a deadline computed from an extreme input must not overflow the poll call.
        return int(min(max(due - now, 0), MAX_SLEEP_MS))

    @property
    def seq(self) -> int:
        """The last `muts` seq sent to the writer."""
        return self.batches.seq

    @property
    def awaiting_commit(self) -> bool:
        """True while some sent batch is not confirmed by the writer yet."""
        return self.batches.awaiting_commit

    # -- the end of a turn -----------------------------------------------------------------

    def finish_turn(self, now: int) -> list[Outgoing]:
        """Run due timers, serve parked requests, and return the turn's outgoing messages.

        The writer's `muts` comes first so that a durable reply can never be sent before the
        batch holding its job was handed to the writer.
        """
        self.event_tap.now = now
        if self.polls.count and self.batches.confirm_pending:
            self.batches.confirm_committed()  # a parked long-poll may take them this turn
        # Each step runs only when it has something to do (most turns: none of them), and
        # each is guarded on its own (`_step`).
        deadline = self.engine.next_deadline()
        if deadline is not None and deadline <= now and now >= self._tick_after:
            self._step(self._tick, now)
        if self.polls.count or self._woken:
            self._step(self._serve_polls, now)
        if self._finished or self.waits.by_job:
            self._step(self._serve_waits, now)
        if self.engine.memory is not None:
            self._step(self._budget.fit, now)
        out: list[Outgoing] = []
        if self.event_tap.items:
            out.extend(("front", m) for m in self.event_tap.take())
        if self.batches.resend_due:
            # Resent in order and before anything new: every mutation carries absolute values,
            # so a batch the old writer did commit is harmless to apply again.
            out.extend(("writer", msg) for msg in self.batches.resends())
        if self._muts or self._durable or self._segments:
            self._flush_mutations(out)
        if self._cancels or self.flows.due or self.flows.flows.new:
            self._notices(out, now)
        if self._replies:
            out.extend(self.take_replies())
        if self.draining and not self._drained_sent and self.drained_now():
            out.append(("front", msgs.drained(self.index)))
            self._drained_sent = True
        return out

    def early_out(self, now: int) -> list[Outgoing]:
        """What a client waits on, to send before `finish_turn` runs the turn's timers and
        parked requests: the turn's batches when one holds durable pushes (their commit is
        the wait), and the turn's replies with the batch of the mutations made so far before
        them (a buffered push's ok waits on nothing but its batch being handed over; a timer
        that fires later in the turn sends its own). In `finish_turn`'s order: the turn's job
        events, the batches, the notices that follow them, the replies. Nothing while a
        resend is due (the resent batches go first, `finish_turn`); `finish_turn` sends
        whatever comes later."""
        if self.batches.resend_due:
            return []
        batches = bool(self._durable or self._segments)
        if not batches and not self._replies:
            return []
        out: list[Outgoing] = []
        if self.event_tap.active:  # it records events only then
            out.extend(("front", m) for m in self.event_tap.take())
        if batches or self._muts:
            self._flush_mutations(out)
        if self._cancels or self.flows.flows.new:  # due resends can wait for `finish_turn`
            self._notices(out, now)
        if self._replies:
            out.extend(self.take_replies())
        return out

    def after_send(self) -> None:
        """The turn's output is sent: make the jobs of the commits it answered deliverable
        (`WriterBatches.confirm_committed`). Off a durable push's round trip, as its reply
        went first; a request handled later finds them deliverable (`handle`)."""
        if self.batches.confirm_pending:
            self.batches.confirm_committed()

    def _notices(self, out: list[Outgoing], now: int) -> None:
        """The turn's flow notices and cancel notices, after its batches, before its replies."""
        # After the batch that stores them: a notice never reaches a parent before the
        # child's outcome it reports is on its way to disk.
        out.extend(("front", msg) for msg in self.flows.take(now))
        if self._cancels:
            # After the batch that dead-letters them: the worker is told of a settled fact.
            notices, self._cancels = self._cancels, []
            out.append(("front", msgs.cancel(notices)))

    def take_replies(self) -> list[Outgoing]:
        """The replies ready to go, as at most one `rep` batch; nothing else runs."""
        replies = self._replies
        if not replies:
            return []
        # Copied, not replaced: `self.batches` holds this very list.
        batch = replies.copy()
        replies.clear()
        return [("front", msgs.rep(batch))]

    @staticmethod
    def _step(step: Callable[[int], None], now: int) -> None:
        """One step of `finish_turn`. A timer or a parked request that raises is logged and
        skipped, never fatal: the rest of the turn (replies, mutations) still goes out."""
        try:
            step(now)
        except Exception:
            _log.exception("shard step failed", step=step.__name__)

    def _tick(self, now: int) -> None:
        """The engine's due timers (`finish_turn` calls it once one is due)."""
        self._tick_after = now + TICK_RETRY_MS  # held off only if the tick raises
        events, muts = self.engine.tick(now)
        self._tick_after = 0
        self._absorb(muts, events)

    def _flush_mutations(self, out: list[Outgoing]) -> None:
        if self._muts or self._durable:
            self._cut()
        send = self.batches.send
        for durable, muts, replies, held in self._segments:
            send(out, durable, muts, replies, held)
        self._segments.clear()
        # Every mutation made so far is in a batch now: the head's mark for them.
        self.batches.mark_head()

    def _cut(self) -> None:
        """End the current segment. A turn's mutations go out as one batch per run of durable
        or buffered requests, in order, so that storage full can drop a durable batch (its
        pushes failed) without dropping buffered work that was already answered ok."""
        self._segments.append((self._seg_durable, self._muts, self._durable, self._durable_ids))
        self._muts, self._durable, self._durable_ids = [], [], []

    # -- requests --------------------------------------------------------------------------

    def _on_req(self, msg: dict[str, Any], now: int) -> None:
        items = msg.get("items")
        if not isinstance(items, list):
            return
        at, end = 0, len(items)
        while at < end:
            item = items[at]
            # [conn, rid, command], or [conn, rid, command, envelope] for the few with one.
            size = len(item) if isinstance(item, list) else 0
            if 3 <= size <= 4 and isinstance(item[0], str) and isinstance(item[2], dict):
                envelope: Envelope = item[3] if size == 4 else None
                # A PUSH followed by another (of any queue) starts a run (`push_run`); the
                # next item is read here, not in a call: a lone PUSH passes here.
                nxt = items[at + 1] if at + 1 < end else None
                name = item[2].get("cmd")
                if (
                    size == 3
                    and name == "PUSH"
                    and type(nxt) is list
                    and len(nxt) == 3
                    and type(nxt[2]) is dict
                    and nxt[2].get("cmd") == "PUSH"
                ):
                    run = push_run(items, at)
                    self._runs.pushes(items[at : at + run], now, self._request)
                    at += run
                    continue
                elif size == 3 and name == "ACK" and type(nxt) is list and len(nxt) == 3:
                    # Consecutive ACKs (a bunqueue Worker acks job by job): ACKB's path.
                    taken = self._runs.acks(items, at, now)
                    if taken:
                        at += taken
                        continue
                if envelope is None or isinstance(envelope, dict):
                    self._request(item[0], item[1], item[2], now, envelope)
                    at += 1
                    continue
            elif size == 3 and type(item[2]) is bytes and isinstance(item[0], str):
                self._raw_pushb(item[0], item[1], item[2], now)
                at += 1
                continue
            _log.warning("malformed request item dropped")
            at += 1

    def _raw_pushb(self, conn: str, rid: int, body: bytes, now: int) -> None:
        """A PUSHB passed on as the client's bytes (`protocol._rawpush`), decoded here once."""
        cmd = decode_raw_pushb(body)
        if cmd is not None:
            self._request(conn, rid, cmd, now, None)
        else:  # changed nothing: the front end answers it the general way
            self._replies.append([conn, rid, raw_refused()])

    def _request(
        self, conn: str, rid: int, cmd: dict[str, Any], now: int, envelope: Envelope
    ) -> None:
        name = cmd.get("cmd")
        tap = self.event_tap
        if tap.active:
            tap.begin(name, cmd, self.engine)
        try:
            reply = self._run(conn, rid, name, cmd, now, envelope)
        except Exception:
            # One bad command must not take the shard's queues down with it.
            _log.exception("command failed", command=name)
            reply = {"ok": False, "error": INTERNAL_SERVER_ERROR}
        if tap.active:
            tap.end(name, reply if reply is not None or not self._durable else self._durable[-1][2])
        if reply is not None:
            self._replies.append([conn, rid, reply])

    def _run(
        self, conn: str, rid: int, name: object, cmd: dict[str, Any], now: int, envelope: Envelope
    ) -> dict[str, Any] | None:
        """Answer one command; None when the answer is parked (long-poll, WaitJob, durable)."""
        # `resent_rounds` first: `resend_failing` is a property, and this runs per command.
        batches = self.batches
        if (
            self.storage_stalled or (batches.resent_rounds and batches.resend_failing)
        ) and is_durable(name, cmd):
            return {"ok": False, "error": STALLED_ERROR}  # refused before it changes anything
        own = self._own_commands.get(name)
        if own is not None:
            return own(conn, rid, cmd, now, envelope)
        store = self.engine.store
        # Whether a PUSHB outside a flow is durable is known before the engine runs it: its
        # jobs are then held as they are admitted (`JobStore.holding`).
        durable = is_durable(name, cmd) if name == "PUSHB" and not envelope else None
        holding = store.holding = [] if durable else None
        try:
            outcome = self.engine.apply(cmd, now, conn)
        finally:
            store.holding = None
        reply, muts = outcome.reply, outcome.mutations
        if outcome.cancels:
            self._cancels.extend(outcome.cancels)
        if reply.get("ok") and name in MAY_BE_DURABLE:
            # A flow's part on this shard stays held until its FlowRelease.
            flow_part = envelope is not None and envelope.get(msgs.ENVELOPE_HOLD) is True
            if flow_part:
                store.hold(_new_jobs(muts))
            if durable is None:
                # A PUSH (most of them) without the call: `is_durable` says the same of it.
                durable = cmd.get("durable") if name == "PUSH" else is_durable(name, cmd)
            if durable:
                self._absorb(muts, outcome.events, durable=True)
                self._durable.append([conn, rid, reply])
                if not flow_part:
                    # Its new jobs are not deliverable before their commit is confirmed.
                    new = _new_jobs(muts) if holding is None else holding
                    if holding is None:
                        store.hold(new)
                    self._durable_ids.extend(new)
                return None
        if holding:  # refused after admitting some: they are buffered pushes' jobs now
            self._woken.update(store.confirm(holding))
        self._absorb(muts, outcome.events)
        return reply

    def _stats_command(
        self, conn: str, rid: int, cmd: dict[str, Any], now: int, envelope: Envelope
    ) -> dict[str, Any]:
        stalled = self.storage_stalled or self.batches.resend_failing
        direct = self.direct_stats() if self.direct_stats is not None else None
        return shard_stats(self.engine, now, stalled=stalled, direct=direct)

    def _compact_memory(
        self, conn: str, rid: int, cmd: dict[str, Any], now: int, envelope: Envelope
    ) -> dict[str, Any]:
        release_memory(self.engine)
        return {"ok": True}

    def _flow_command(
        self, conn: str, rid: int, cmd: dict[str, Any], now: int, envelope: Envelope
    ) -> dict[str, Any] | None:
        """A notice from another shard is answered (and so acknowledged) only once what it
        changed is committed, like a durable push, but it is never dropped on a full disk: the
        child's shard sends it again until then. A release wakes the long-polls it fed."""
        outcome = self.engine.apply(cmd, now, conn)
        reply = outcome.reply
        self._absorb(outcome.mutations, outcome.events)
        if cmd.get("cmd") == FLOW_RELEASE:
            return reply
        self._durable.append([conn, rid, reply])
        return None

    def _on_flowack(self, msg: dict[str, Any], now: int) -> None:
        keys = msg.get("keys")
        if isinstance(keys, list):
            self.flows.acked(keys)
            self._absorb(self.engine.flows.acked(keys), ())

    def _apply(self, cmd: Mapping[str, Any], now: int, conn: str | None = None) -> dict[str, Any]:
        outcome = self.engine.apply(cmd, now, conn)
        self._absorb(outcome.mutations, outcome.events)
        if outcome.cancels:
            self._cancels.extend(outcome.cancels)
        return outcome.reply

    # -- what a turn changed ---------------------------------------------------------------

    def _absorb(
        self,
        muts: list[Mutation],
        events: Iterable[tuple[str, str, str]],
        *,
        durable: bool = False,
    ) -> None:
        if muts:
            if durable is not self._seg_durable:
                if self._muts or self._durable:
                    self._cut()
                self._seg_durable = durable
            self._muts.extend(muts)
        if self.event_tap.active:
            self.event_tap.observe(muts, events, self.engine)
        if self.polls.count:
            note_wakeups(self._woken, muts, events, self.engine.find)
        if self.waits.by_job:
            for m in muts:
                if m[0] == "del" or (m[0] == "upd" and m[2].get("state") == "completed"):
                    self._finished.add(job_id_of(m[1]))
                elif m[0] == "qdrain":  # its cold jobs are gone, none named: look at each
                    self._finished.update(self.waits.by_job)


def _new_jobs(muts: list[Mutation]) -> list[str]:
    """The ids of the jobs a command put."""
    return [m[1]["id"] for m in muts if m[0] == "put"]
