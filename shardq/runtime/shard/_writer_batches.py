"""The batches one shard sent to the writer, and what the writer answered about them.

`WriterBatches` numbers each `muts` batch (`seq`), keeps those the writer has not confirmed
(a restarted writer gets them again), holds the replies of durable requests and the jobs they
pushed until the `done` that covers their batch, and takes the writer's answers: `done`,
`fail`, `rejected`, and `writer-up` from the shard's own loop.

A durable batch's replies ride with it (`rep`, packed as the front end's `rep` message): once
the batch is committed the writer hands them to the front end itself, one hop before this
shard could, and its `done` lists the batch (`answered`), so the shard drops its copy. The
last `done`'s answered replies are kept until the next one: a writer killed between its
`done` and its `rep` leaves them to the shard, which sends them when a writer is back (the
front end ignores a reply it already delivered).

It also handles what storage refuses. Two ways a mutation can fail to reach the disk: this
shard cannot encode it (an integer past 64 bits in a job's data ...), or the writer refuses it
(`fail`: a durable batch dropped on a full disk; `rejected`: single mutations the store could
not take). Either way memory is made to match the disk, and a request still waiting for its
reply is answered with an error rather than a false ok (docs/runtime.md).

`ShardCore` holds one and hands it what it needs of the core: the engine, its reply outbox and
set of woken queues (both kept as the same objects for the shard's life), and its `_absorb`,
which takes the mutations a refusal makes into the turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeAlias

import structlog

from shardq.core import Engine, Mutation, job_id_of
from shardq.protocol import INTERNAL_SERVER_ERROR
from shardq.runtime import _messages as msgs
from shardq.runtime.links._control import pack
from shardq.runtime.shard._batches import cut_batches, fits_one_batch
from shardq.runtime.shard._salvage import names_job, pack_mutations
from shardq.storage import MutationEncoder, describe, put_keys

__all__ = ["MAX_RESEND_ROUNDS", "Absorb", "Item", "WriterBatches"]

Item: TypeAlias = list[Any]  # [conn, rid, reply]
Absorb: TypeAlias = Callable[[list[Mutation], Iterable[tuple[str, str, str]]], None]
"""`ShardCore._absorb`: mutations (and events) into the current turn."""

# Writer restarts after which the same oldest batch is still unconfirmed: the shard reports
# storage degraded (and refuses durable pushes) until a `done` moves past it.
MAX_RESEND_ROUNDS: Final = 3

_log = structlog.get_logger()


class WriterBatches:
    """Batches sent to the writer and not confirmed yet, the replies and jobs held on them,
    and the handling of the writer's answers."""

    def __init__(
        self,
        index: int,
        engine: Engine,
        *,
        replies: list[Item],
        woken: set[str],
        absorb: Absorb,
        batch_max_bytes: int,
        batch_max_mutations: int,
        hard_max_bytes: int,
    ) -> None:
        """`replies` and `woken` are the core's: replies ready to go, and queues whose parked
        long-polls may be served now; both are filled here, never replaced. `hard_max_bytes`
        is the most one mutation may take: more is refused to its client."""
        self._index = index
        self._engine = engine
        self._replies = replies
        self._woken = woken
        self._absorb = absorb
        self._batch_max_bytes = batch_max_bytes
        self._batch_max_mutations = batch_max_mutations
        self._hard_max_bytes = hard_max_bytes
        # Puts and updates go to the writer already encoded (shardq.storage._encode): this
        # shard packs them once, and the writer stores the bytes without decoding a record.
        # A run of updates sharing one change map goes as one `updm`, kept well inside the
        # batch bounds: at most a batch's count of keys, a quarter of its bytes.
        self.encoder = MutationEncoder(
            max_group_keys=batch_max_mutations,
            max_group_bytes=min(batch_max_bytes, hard_max_bytes) // 4,
        )
        self.seq = 0  # last `muts` seq sent to the writer
        self.committed = 0  # highest seq the writer confirmed
        self._urged = 0  # the last seq the writer was asked to commit at once
        # Batches sent but not confirmed: a writer that dies loses what it had not committed,
        # so a restarted writer gets them again ("writer-up"). Bounded by the writer's
        # back-pressure: a writer that stops reading stops this shard's sends.
        self._unconfirmed: deque[tuple[int, msgs.MutsMsg]] = deque()
        # Their packed sizes (`sized`), and the sum: what the writer holds uncommitted for
        # this shard, or its socket, or this shard's link; past `writer_unconfirmed_max_bytes`
        # the shard reads no request until a `done` brings it back under (docs/runtime.md).
        self._sizes: dict[int, int] = {}
        self.unconfirmed_bytes = 0
        self.unconfirmed_peak = 0  # the largest `unconfirmed_bytes` seen, for the stop line
        # Replies of durable requests, sent once the `done` covering their seq comes:
        # (seq, replies, whether they rode with batch seq for the writer to deliver).
        self._held: deque[tuple[int, list[Item], bool]] = deque()
        # The replies the writer said it delivers, as of the last `done` (module docstring).
        self._answered: list[Item] = []
        # Jobs the engine holds until their batch's `done`: (seq, job ids), in seq order.
        self._holding: deque[tuple[int, list[str]]] = deque()
        # Jobs whose batch a `done` covered, made deliverable once the turn's replies are
        # written (`confirm_committed`): a durable push's client is not kept waiting while
        # its jobs go onto the ready heap. Nothing is handed out meanwhile (`ShardCore`).
        self._confirm_later: list[list[str]] = []
        self.resend_due = False  # the writer came back: resend every unconfirmed batch
        # The oldest unconfirmed seq and how many times it was resent: a batch no writer
        # confirms however often it is resent degrades the shard instead of being retried
        # unnoticed. `resent_rounds` is 0 unless a batch was resent, a cheap test per command.
        self._resent_first = 0
        self.resent_rounds = 0
        # Under a head budget: (seq, the head's mark) for each turn that sent a batch; the
        # `done` covering seq tells the head that its cold writes up to the mark are stored
        # (`shardq.core._head`: its reads of the backlog show them from then on). The head
        # is read from the engine each time: a memory budget installs it while running.
        self._marks: deque[tuple[int, int]] = deque()

    def only_delivered_elsewhere(self) -> bool:
        """True while something awaits the writer and all of it is durable batches whose
        replies ride with them (the writer delivers those): no reply of this shard's waits
        on the writer's next message. Checked each turn, so only a few batches are looked at:
        more in flight means a busy shard, which reads its link at once anyway."""
        unconfirmed = self._unconfirmed
        if not unconfirmed or len(unconfirmed) > 4 or len(self._held) > 4:
            return False
        return all("rep" in msg for _, msg in unconfirmed) and all(
            riding for _, _, riding in self._held
        )

    def replies_held_here(self) -> bool:
        """True while a reply this shard sends itself (not one riding with its batch for the
        writer to deliver) waits on a commit, and few enough wait that this is one request
        in flight rather than a busy shard (`CommitSpin`)."""
        held = self._held
        return 0 < len(held) <= 4 and not all(riding for _, _, riding in held)

    def sized(self, seq: int, nbytes: int) -> None:
        """Batch `seq` went out packed in `nbytes` (again, if resent): counted in
        `unconfirmed_bytes` until its `done`."""
        if seq <= self.committed:
            return
        self.unconfirmed_bytes += nbytes - self._sizes.get(seq, 0)
        self._sizes[seq] = nbytes
        if self.unconfirmed_bytes > self.unconfirmed_peak:
            self.unconfirmed_peak = self.unconfirmed_bytes

    def _unsize(self, seq: int) -> None:
        self.unconfirmed_bytes -= self._sizes.pop(seq, 0)

    @property
    def awaiting_commit(self) -> bool:
        """True while some sent batch is not confirmed by the writer yet."""
        return self.committed < self.seq

    # -- what goes out ---------------------------------------------------------------------

    def send(
        self,
        out: list[tuple[str, Any]],
        durable: bool,
        muts: list[Mutation],
        replies: list[Item],
        held_ids: list[str],
    ) -> None:
        """One segment of a turn (`ShardCore._cut`) to `out`: its mutations as `muts`
        batches, its durable `replies` held until their commit, the engine's `held_ids`
        confirmed then."""
        last = self._send_muts(out, durable, muts, replies) if muts else None
        if replies:
            # Even a durable push that wrote nothing (a duplicate) waits for the latest seq:
            # the job it returned may sit in a batch the writer has not committed yet.
            if self.committed < self.seq:
                riding = last is not None and durable and self._attach(last, replies)
                self._held.append((self.seq, replies, riding))
                if self._urged < self.seq:
                    # It waits on buffered batches only (a durable duplicate wrote nothing):
                    # without this, their commit would wait out the flush interval.
                    out.append(("writer", msgs.flush(self._index, self.seq)))
                    self._urged = self.seq
            else:
                self._replies.extend(replies)
        if held_ids:
            self._holding.append((self.seq, held_ids))

    def _attach(self, msg: msgs.MutsMsg, replies: list[Item]) -> bool:
        """Let the writer deliver `replies` once `msg` is committed: True if they ride with
        it. Only the front end's requests (positive rids; a direct port's are this shard's
        to answer), and only while the batch stays well inside its byte bound."""
        if not all(type(item[1]) is int and item[1] > 0 for item in replies):
            return False
        try:
            packed = pack(msgs.rep(replies))
        except (TypeError, ValueError, OverflowError):
            return False
        room = min(self._batch_max_bytes, self._hard_max_bytes) - self.encoder.encoded_bytes
        if len(packed) > room // 2:
            return False
        msg["rep"] = packed
        return True

    def _send_muts(
        self, out: list[tuple[str, Any]], durable: bool, muts: list[Mutation], replies: list[Item]
    ) -> msgs.MutsMsg | None:
        """Send a segment's mutations; return its batch if it went as one (else None)."""
        encoder = self.encoder
        try:
            encoded = encoder.encode(muts)
            whole = encoder.unencoded == 0
        except (TypeError, ValueError, OverflowError):
            encoded, whole = self._encode_each(muts, replies), False
        # Bounded at the source: the writer never gets a frame it must drop, so nothing
        # is resent for ever (docs/runtime.md, "Writer batches").
        limit = min(self._batch_max_bytes, self._hard_max_bytes)
        too_large: list[tuple[Mutation, int]] = []
        if whole and fits_one_batch(
            len(encoded), encoder.encoded_bytes, limit, self._batch_max_mutations
        ):
            batches = [encoded]
        else:
            batches, too_large = cut_batches(
                encoded, self._batch_max_bytes, self._batch_max_mutations, self._hard_max_bytes
            )
        if too_large:
            self._refuse_too_large(too_large, self._hard_max_bytes, replies)
        last = self.seq + len(batches)
        for batch in batches:
            self.seq += 1
            msg = msgs.muts(self._index, self.seq, batch)
            if durable:
                msg["durable"] = True  # a reply waits on this commit: the writer flushes now
                self._urged = self.seq
            out.append(("writer", msg))
            self._unconfirmed.append((self.seq, msg))
            if durable and len(batches) > 1:
                msg["upto"] = last  # the replies wait on the last (`on_fail`)
        return msg if len(batches) == 1 else None

    def mark_head(self) -> None:
        """After a turn's batches went out: the head's mark for every mutation made so far,
        confirmed with the `done` of the last batch sent."""
        head = self._engine.head
        if head is None or self.seq <= self.committed:
            return
        if self._marks and self._marks[-1][0] == self.seq:
            return  # nothing sent since the last mark
        self._marks.append((self.seq, head.mark()))

    def resends(self) -> list[msgs.MutsMsg]:
        """Every unconfirmed batch, in order, for a writer that came back (`resend_due`)."""
        self.resend_due = False
        for _, msg in self._unconfirmed:
            # The writer that was to deliver these replies is gone; this shard answers them
            # on the new writer's `done` (a reply may have been delivered already: the front
            # end ignores a second one).
            msg.pop("rep", None)
        return [msg for _, msg in self._unconfirmed]

    # -- what cannot be encoded ------------------------------------------------------------

    def _encode_each(self, muts: list[Mutation], held: list[Item]) -> list[Mutation]:
        """Encode a batch that failed as a whole, one mutation at a time, dropping those that
        cannot be encoded (an integer past 64 bits ...). Each dropped one is handled as if
        the writer had rejected it: memory is made to match the disk, and the request that
        made it is answered with an error if its reply has not gone out."""
        out: list[Mutation] = []
        dropped: list[list[Any]] = []
        for m in muts:
            try:
                encoded = self.encoder.encode((m,))
                pack_mutations(encoded)
            except (TypeError, ValueError, OverflowError) as e:
                dropped.append([*describe(m), f"{type(e).__name__}: {e}"])
                continue
            out.extend(encoded)
        self._reject_here(dropped, held)
        return out

    def salvage_batch(self, msg: msgs.MutsMsg) -> msgs.MutsMsg:
        """`msg` (a `muts` batch that could not be packed) without its mutations that cannot
        be packed, changed in place, so a resend of it packs too; see `_encode_each`."""
        kept: list[Mutation] = []
        dropped: list[list[Any]] = []
        for m in msg.get("muts", ()):
            try:
                pack_mutations((m,))
            except (TypeError, ValueError, OverflowError) as e:
                dropped.append([*describe(m), f"{type(e).__name__}: {e}"])
                continue
            kept.append(m)
        msg["muts"] = kept
        self._reject_here(dropped, [])
        return msg

    def _refuse_too_large(
        self, items: list[tuple[Mutation, int]], limit: int, held: list[Item]
    ) -> None:
        """Mutations no writer frame can carry (one job's record or change past the link's
        frame limit): handled as those that cannot be encoded, with an error that says why."""
        dropped = [
            [*describe(m), f"{size} bytes exceed the storage link's {limit}"] for m, size in items
        ]
        self._reject_here(dropped, held, too_large=True)

    def _reject_here(
        self, items: list[list[Any]], held: list[Item], *, too_large: bool = False
    ) -> None:
        for kind, key, error in items:
            job_id = job_id_of(key) if isinstance(key, str) and kind != "queue" else None
            _log.error("mutation cannot be encoded", kind=kind, job_id=job_id, error=error)
            if job_id is None or kind not in ("put", "upd", "delta"):
                continue
            # No kind can reach the disk: the job's copy in memory holds a value no store
            # can take, so it goes, as a rejected put does (its stored row, if any, comes back
            # at the next start). A reply still to be sent for it becomes an error.
            self._absorb(self._engine.store.forget((job_id,), stored=False), ())
            message = f"Job too large to store: {error}" if too_large else INTERNAL_SERVER_ERROR
            refused = {"ok": False, "error": message}
            for pending in (held, self._replies):
                for item in pending:
                    if names_job(item[2], job_id):
                        item[2] = refused

    # -- what the writer answered ----------------------------------------------------------

    def on_done(self, msg: dict[str, Any], now: int) -> None:
        """The writer committed every batch up to `seq`: release what waited on them."""
        seq = msg.get("seq")
        if not isinstance(seq, int):
            return
        self.committed = committed = max(self.committed, seq)
        unconfirmed, held, holding = self._unconfirmed, self._held, self._holding
        while unconfirmed and unconfirmed[0][0] <= committed:
            self._unsize(unconfirmed.popleft()[0])
        answered = msg.get("answered")
        delivered = frozenset(answered) if type(answered) is list else frozenset()
        self._answered = []
        while held and held[0][0] <= committed:
            held_seq, items, riding = held.popleft()
            if riding and held_seq in delivered:
                self._answered.extend(items)  # the writer sends them (module docstring)
            else:
                self._replies.extend(items)
        while holding and holding[0][0] <= committed:
            self._confirm_later.append(holding.popleft()[1])
        self._marks_through(committed)

    @property
    def confirm_pending(self) -> bool:
        """Whether a `done` left committed jobs held (`confirm_committed` not called yet)."""
        return bool(self._confirm_later)

    def confirm_committed(self) -> None:
        """Make the jobs of the batches the writer confirmed deliverable (`on_done` leaves
        them held until now); the queues that got ready jobs go into `woken`."""
        later = self._confirm_later
        if later:
            confirm = self._engine.store.confirm
            for ids in later:
                self._woken.update(confirm(ids))
            later.clear()

    def _marks_through(self, seq: int) -> None:
        """Tell the head the mutations marked up to `seq` are settled (its backlog reads no
        longer need to merge them)."""
        marks = self._marks
        if marks and marks[0][0] <= seq:
            mark = marks.popleft()[1]
            while marks and marks[0][0] <= seq:
                mark = marks.popleft()[1]
            head = self._engine.head
            assert head is not None
            head.committed(mark)

    def on_fail(self, msg: dict[str, Any], now: int) -> None:
        seq = msg.get("seq")
        if not isinstance(seq, int):
            return
        error = {"ok": False, "error": f"Storage unavailable: {msg.get('error')}"}
        # A durable run of requests cut into several batches fails as a whole: its replies
        # wait on the last batch (`upto`), and none may say ok once a part of it is dropped.
        batch = next((m for s, m in self._unconfirmed if s == seq), None)
        upto = batch.get("upto", seq) if batch is not None and batch.get("durable") else seq
        failed = 0
        while self._held and self._held[0][0] <= upto:
            for conn, rid, _reply in self._held.popleft()[1]:
                self._replies.append([conn, rid, error])
                failed += 1
        _log.warning("durable replies failed", seq=seq, count=failed, error=msg.get("error"))
        if msg.get("dropped") is True:
            self._dropped_through(upto)
            return
        for part in range(seq, upto + 1):
            self._forget_batch(part)

    def _dropped_through(self, seq: int) -> None:
        """The writer dropped every batch up to `seq` for good (fenced: the node lost a
        partition they write). Never resent, and nothing waits on them any more: a partition
        change's `loaded` report, a job's confirmation and the head's marks would otherwise
        wait for a `done` that never comes (a node frozen past its lease served none of the
        partitions it took back). Their jobs are not stored: the partitions they belong to are
        dropped from memory by the `parts` message that follows the loss."""
        for s, _ in self._unconfirmed:
            if s <= seq:
                self._unsize(s)
        self._unconfirmed = deque((s, m) for s, m in self._unconfirmed if s > seq)
        self._holding = deque((s, ids) for s, ids in self._holding if s > seq)
        self.committed = max(self.committed, seq)
        self._marks_through(seq)

    def _forget_batch(self, seq: int) -> None:
        """The writer dropped durable batch `seq` (storage full): its pushes were answered
        with an error, so their jobs leave memory and the batch is never resent."""
        batch = next((m for s, m in self._unconfirmed if s == seq), None)
        if batch is None or not batch.get("durable"):
            return  # a buffered batch: the writer keeps it and commits it later
        self._unconfirmed = deque((s, m) for s, m in self._unconfirmed if s != seq)
        self._unsize(seq)
        self._holding = deque((s, ids) for s, ids in self._holding if s != seq)
        puts = [key for m in batch["muts"] for key in put_keys(m)]  # each of a `putm`'s
        self._absorb(self._engine.store.forget([job_id_of(key) for key in puts], stored=False), ())

    def on_rejected(self, msg: dict[str, Any], now: int) -> None:
        """The writer could not store some mutations of batch `seq` (docs/runtime.md): make
        memory match the disk, and fail the durable push that waits on a rejected job."""
        seq, items = msg.get("seq"), msg.get("items")
        if not isinstance(seq, int) or not isinstance(items, list):
            return
        for item in items:
            if not (isinstance(item, list) and len(item) >= 3 and isinstance(item[1], str)):
                continue
            kind, key, error = item[0], item[1], item[2]
            job_id = job_id_of(key)
            _log.error("the writer rejected a mutation", seq=seq, kind=kind, job_id=job_id)
            if kind == "put":
                self._unpush(seq, job_id, str(error))
            elif kind == "upd":
                self._engine.reload(job_id, item[3] if len(item) > 3 else None, now)

    def _unpush(self, seq: int, job_id: str, error: str) -> None:
        """A job's put was rejected: it is not stored, so it must not stay in memory. A durable
        push still waiting for it is answered with an error, and the other jobs of that
        push are deleted too, so that a client that retries it creates no duplicate."""
        self._absorb(self._engine.store.forget((job_id,), stored=False), ())
        refused = {"ok": False, "error": f"Storage rejected job {job_id}: {error}"}
        for held_seq, items, _riding in self._held:
            if held_seq != seq:
                continue
            for item in items:
                reply = item[2]
                if names_job(reply, job_id):
                    item[2] = refused
                    ids = reply.get("ids") or ()
                    others = [i for i in ids if isinstance(i, str) and i != job_id]
                    self._absorb(self._engine.store.forget(others, stored=True), ())

    # -- a writer that restarts ------------------------------------------------------------

    @property
    def resend_failing(self) -> bool:
        """Whether the oldest unconfirmed batch went unconfirmed through `MAX_RESEND_ROUNDS`
        writer restarts (storage degraded until a `done` covers it)."""
        return (
            self.resent_rounds > MAX_RESEND_ROUNDS
            and bool(self._unconfirmed)
            and (self._unconfirmed[0][0] == self._resent_first)
        )

    def on_writer_up(self, msg: dict[str, Any], now: int) -> None:
        if self._answered:
            # The writer may have died between its `done` and its `rep`: send them too.
            self._replies.extend(self._answered)
            self._answered = []
        if self._unconfirmed:
            first = self._unconfirmed[0][0]
            rounds = self.resent_rounds + 1 if self._resent_first == first else 1
            self._resent_first, self.resent_rounds = first, rounds
            if rounds == MAX_RESEND_ROUNDS + 1:
                _log.error(
                    "storage degraded: the writer confirms no resent batch; durable pushes "
                    "are refused until it does",
                    first_seq=first,
                    resends=rounds,
                )
            _log.warning(
                "writer restarted; resending unconfirmed batches",
                batches=len(self._unconfirmed),
                first_seq=first,
            )
            self.resend_due = True
