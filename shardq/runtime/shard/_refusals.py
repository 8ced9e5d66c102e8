"""What a shard does when storage refuses part of its work.

Two ways a mutation can fail to reach the disk: this shard cannot encode it (an integer past 64
bits in a job's data ...), or the writer refuses it (`fail`: a durable batch dropped on a full
disk; `rejected`: single mutations the store could not take). Either way memory is made to
match the disk, and a request still waiting for its reply is answered with an error rather
than a false ok (docs/runtime.md). `ShardCore` takes these in through this mixin.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeAlias

import structlog

from shardq.core import Engine, Mutation, job_id_of
from shardq.protocol import INTERNAL_SERVER_ERROR
from shardq.runtime._messages import MutsMsg
from shardq.runtime.shard._salvage import names_job, pack_mutations
from shardq.storage import MutationEncoder, describe

__all__ = ["Item", "StorageRefusals"]

Item: TypeAlias = list[Any]  # [conn, rid, reply]

# Writer restarts after which the same oldest batch is still unconfirmed: the shard reports
# storage degraded (and refuses durable pushes) until a `done` moves past it.
MAX_RESEND_ROUNDS: Final = 3

_log = structlog.get_logger()


class StorageRefusals:
    """Handling of mutations that cannot be encoded or that the writer refused."""

    # Set by `ShardCore`.
    engine: Engine
    _encoder: MutationEncoder
    _replies: list[Item]
    _held: deque[tuple[int, list[Item]]]
    _holding: deque[tuple[int, list[str]]]
    _unconfirmed: deque[tuple[int, MutsMsg]]
    _absorb: Callable[[list[Mutation], Iterable[tuple[str, str, str]]], None]
    _apply: Callable[[Mapping[str, Any], int], dict[str, Any]]
    _resend: bool
    _resent: tuple[int, int]

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
                encoded = self._encoder.encode((m,))
                pack_mutations(encoded)
            except (TypeError, ValueError, OverflowError) as e:
                dropped.append([*describe(m), f"{type(e).__name__}: {e}"])
                continue
            out.extend(encoded)
        self._reject_here(dropped, held)
        return out

    def salvage_batch(self, msg: MutsMsg) -> MutsMsg:
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
            self._absorb(self.engine.forget((job_id,), stored=False), ())
            message = f"Job too large to store: {error}" if too_large else INTERNAL_SERVER_ERROR
            refused = {"ok": False, "error": message}
            for pending in (held, self._replies):
                for item in pending:
                    if names_job(item[2], job_id):
                        item[2] = refused

    # -- what the writer refused -----------------------------------------------------------

    def _on_fail(self, msg: dict[str, Any], now: int) -> None:
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
        for part in range(seq, upto + 1):
            self._forget_batch(part)

    def _forget_batch(self, seq: int) -> None:
        """The writer dropped durable batch `seq` (storage full): its pushes were answered
        with an error, so their jobs leave memory and the batch is never resent."""
        batch = next((m for s, m in self._unconfirmed if s == seq), None)
        if batch is None or not batch.get("durable"):
            return  # a buffered batch: the writer keeps it and commits it later
        self._unconfirmed = deque((s, m) for s, m in self._unconfirmed if s != seq)
        self._holding = deque((s, ids) for s, ids in self._holding if s != seq)
        puts = [key for kind, key in map(describe, batch["muts"]) if kind == "put" and key]
        self._absorb(self.engine.forget([job_id_of(key) for key in puts], stored=False), ())

    def _on_rejected(self, msg: dict[str, Any], now: int) -> None:
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
                self.engine.reload(job_id, item[3] if len(item) > 3 else None, now)

    def _unpush(self, seq: int, job_id: str, error: str) -> None:
        """A job's put was rejected: it is not stored, so it must not stay in memory. A durable
        push still waiting for it is answered with an error, and the other jobs of that
        push are deleted too, so that a client that retries it creates no duplicate."""
        self._absorb(self.engine.forget((job_id,), stored=False), ())
        refused = {"ok": False, "error": f"Storage rejected job {job_id}: {error}"}
        for held_seq, items in self._held:
            if held_seq != seq:
                continue
            for item in items:
                reply = item[2]
                if names_job(reply, job_id):
                    item[2] = refused
                    ids = reply.get("ids") or ()
                    others = [i for i in ids if isinstance(i, str) and i != job_id]
                    self._absorb(self.engine.forget(others, stored=True), ())

    # -- what the front-end link or the writer could not take ------------------------------

    def give_back(self, job_ids: Iterable[str], now: int) -> None:
        """Jobs a pull took whose reply could not be sent (too large for the link): back to
        waiting, as if never pulled (no attempt is charged)."""
        given = 0
        for job_id in job_ids:
            job = self.engine.find(job_id)
            if job is None or job.state != "active":
                continue
            cmd = {"cmd": "MoveToWait", "id": job_id, "token": job.token}
            if self._apply(cmd, now).get("ok"):
                given += 1
        if given:
            _log.warning("pulled jobs put back: their reply was too large", jobs=given)

    @property
    def resend_failing(self) -> bool:
        """Whether the oldest unconfirmed batch went unconfirmed through `MAX_RESEND_ROUNDS`
        writer restarts (storage degraded until a `done` covers it)."""
        first, rounds = self._resent
        return (
            rounds > MAX_RESEND_ROUNDS
            and bool(self._unconfirmed)
            and (self._unconfirmed[0][0] == first)
        )

    def _on_writer_up(self, msg: dict[str, Any], now: int) -> None:
        if self._unconfirmed:
            first = self._unconfirmed[0][0]
            rounds = self._resent[1] + 1 if self._resent[0] == first else 1
            self._resent = (first, rounds)
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
            self._resend = True
