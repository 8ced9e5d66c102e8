"""The writer's flush policy, without I/O: what to commit when, and what to tell each shard.

`FlushBuffer` holds the mutation batches and syncs received since the last commit, in arrival
order. The writer asks it when the next flush is due (`deadline`), hands `mutations()` to
`Store.apply` as one transaction, and reports the outcome with `committed()` or `failed()`;
both return the confirmations to send, as `(shard, message)` pairs. Time is an argument
(seconds on the monotonic clock), so the policy is tested without sleeping.

Shard incarnations. A shard numbers its batches from 1 each time its process starts, so a
`done` meant for the previous process could confirm the new one's batches before they are
committed. The buffer therefore counts an *epoch* per shard: a `sync` (sent once, at start-up)
or a seq that goes backwards starts a new one, and confirmations are only sent for batches of
the current epoch. Batches of an old epoch are still committed, never dropped: their process is
gone, not their data.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from shardq.core import Mutation
from shardq.runtime import _messages as msgs
from shardq.runtime.writer._bounds import MAX_BUFFERED_BYTES, MAX_BUFFERED_MUTATIONS
from shardq.storage import StorageError, StorageFull

__all__ = ["MAX_BUFFERED_MUTATIONS", "FlushBuffer", "Outgoing"]

Outgoing = tuple[int, Mapping[str, Any]]
"""A message for a shard: (shard index, message map)."""

RETRY_FIRST_S = 0.1  # the backoff: 100 ms, doubling ...
RETRY_MAX_S = 30.0  # ... up to 30 s


@dataclass(slots=True)
class _Batch:
    shard: int
    epoch: int
    seq: int
    size: int
    durable: bool = False  # a durable reply waits on it: dropped, not kept, when storage is full
    told_fail: bool = False
    nbytes: int = 0  # the frame it came in
    ops: int = 0  # job mutations it stands for (an `updm` or a `putm` counts each of its jobs)
    rep: bytes | None = None  # its replies, for the front end once committed (`replies`)


class FlushBuffer:
    """Batches waiting for one commit. `interval_s`/`max_mutations`: when a flush is due."""

    def __init__(
        self,
        interval_s: float,
        max_mutations: int,
        *,
        max_buffered: int = MAX_BUFFERED_MUTATIONS,
        retry_max_s: float = RETRY_MAX_S,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
    ) -> None:
        self._interval = interval_s
        self._retry_max = retry_max_s
        self.storage_full = False
        """The last flush failed because storage is full (until a commit succeeds)."""
        # While full, durable batches that arrive before this time fail at once; the first
        # one after it is buffered and tried: the probe that notices freed space.
        self._probe_at = 0.0
        self._max = max_mutations
        self._max_buffered = max_buffered
        self._max_bytes = max_buffered_bytes
        self._bytes = 0  # of the batches waiting
        self._muts: list[Mutation] = []
        # What the count bounds apply to: the mutations waiting, each job of an `updm` or a
        # `putm` counted (`shardq.storage._encode`), so that a shard grouping its updates and
        # puts leaves the flush policy as it was.
        self._ops = 0
        self._batches: list[_Batch] = []
        self._with_replies = 0  # waiting batches that carry replies (`rep`)
        self.drains = False
        """Whether a waiting batch holds a `qdrain` (its commit may record a range to delete
        in pieces, `_drain_pieces`; read before `committed` clears it)."""
        self._syncs: list[tuple[int, int, int]] = []  # (shard, epoch, seq)
        self._first_at: float | None = None
        self._urgent = False
        self._epochs: dict[int, int] = {}
        self._last_seq: dict[int, int] = {}
        self.failures = 0
        """Failed flush attempts since the last commit (0 when storage is healthy)."""
        self.failing_since: float | None = None
        self._retry_at: float | None = None

    # -- input

    def add_muts(
        self,
        shard: int,
        seq: int,
        mutations: list[Mutation],
        now: float,
        *,
        urgent: bool = False,
        nbytes: int = 0,
        rep: bytes | None = None,
    ) -> list[Outgoing]:
        """Buffer one batch of a shard (a `muts` message). `urgent`: a durable reply waits on
        it, so the next flush is due at once (whatever else has arrived shares that commit).
        `rep`: the replies waiting on it, packed for the front end (`replies`).

        While storage is full, a durable batch is not buffered at all: its `fail` is returned
        at once (its pushes are answered now, not after the retry backoff, and the shard
        forgets them). Otherwise returns nothing.
        """
        epoch = self._epoch(shard, seq, restart=False)
        if urgent and self.storage_full and now < self._probe_at:
            return [(shard, msgs.fail(seq, FULL_REASON))]
        extra, drains = _scan(mutations)
        ops = len(mutations) + extra
        if drains:
            self.drains = True
        self._batches.append(
            _Batch(
                shard, epoch, seq, len(mutations), durable=urgent, nbytes=nbytes, ops=ops, rep=rep
            )
        )
        self._bytes += nbytes
        self._ops += ops
        if rep is not None:
            self._with_replies += 1
        self._muts.extend(mutations)
        if self._first_at is None:
            self._first_at = now
        self._urgent = self._urgent or urgent
        return []

    def urge(self) -> None:
        """Take a `flush`: a durable reply waits on a batch already buffered, which came
        without `durable` (a duplicate durable push behind a buffered one). Flush at once."""
        if self._batches:
            self._urgent = True

    def add_sync(self, shard: int, seq: int, now: float) -> list[Outgoing]:
        """Take a `sync`; answer it now if nothing is waiting, else after the next commit."""
        epoch = self._epoch(shard, seq, restart=True)
        if not self._batches:
            return [(shard, msgs.done(seq, synced=True))]
        self._syncs.append((shard, epoch, seq))
        return []

    # -- policy

    @property
    def pending(self) -> int:
        """Mutations waiting for a commit (each job of an `updm` or a `putm` counted)."""
        return self._ops

    @property
    def pending_batches(self) -> int:
        """Batches waiting for a commit."""
        return len(self._batches)

    @property
    def accepting(self) -> bool:
        """Whether to read more input (false while storage fails and the buffer is full, in
        mutations or in bytes)."""
        return self._ops < self._max_buffered and self._bytes < self._max_bytes

    def deadline(self) -> float | None:
        """When the next flush is due (monotonic seconds), or None if nothing waits."""
        if self._retry_at is not None:
            return self._retry_at
        if self._first_at is None:
            return None
        if self._urgent or self._syncs or self._ops >= self._max:
            return self._first_at  # already due: a shard waits on a durable reply or a sync
        return self._first_at + self._interval

    def due(self, now: float) -> bool:
        """Whether a flush should run at `now`."""
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def full(self) -> bool:
        """Whether enough mutations wait for a flush regardless of the interval."""
        return self._retry_at is None and self._ops >= self._max

    def mutations(self) -> list[Mutation]:
        """Everything waiting, in arrival order: the next transaction. Do not modify it."""
        return self._muts

    # -- outcome

    def replies(self, refused: Collection[tuple[int, int]]) -> list[tuple[int, int, bytes]]:
        """The replies the waiting batches carry, as `(shard, seq, rep message)`, for the
        front end once they are committed: only a shard's current process's (an older one's
        requests were answered when it died), and none of a batch with a mutation `refused`
        (its `(shard, seq)`: the shard turns that reply into an error)."""
        if not self._with_replies:
            return []  # the usual case: no batch carries any (a shard answers its own)
        return [
            (batch.shard, batch.seq, batch.rep)
            for batch in self._batches
            if batch.rep is not None
            and batch.epoch == self._epochs.get(batch.shard, 0)
            and (batch.shard, batch.seq) not in refused
        ]

    def committed(self, answered: Mapping[int, list[int]] | None = None) -> list[Outgoing]:
        """The waiting batches are committed: clear them; return `done` per shard (and syncs).
        `answered`: per shard, the seqs whose replies the writer delivers (`replies`)."""
        if len(self._batches) == 1 and not self._syncs:
            return self._lone_committed(answered)
        latest: dict[int, int] = {}
        for batch in self._batches:
            if batch.epoch == self._epochs.get(batch.shard, 0):
                latest[batch.shard] = max(batch.seq, latest.get(batch.shard, batch.seq))
        out = self._synced_dones()
        told = answered or {}
        out.extend(
            (shard, msgs.done(seq, answered=told.get(shard))) for shard, seq in latest.items()
        )
        self._forget_all()
        self.storage_full = False
        return out

    def _lone_committed(self, answered: Mapping[int, list[int]] | None) -> list[Outgoing]:
        """`committed` for a lone batch and no sync (a durable push's own commit): its
        `done`, without the per-shard bookkeeping; the shard's client waits on it."""
        batch = self._batches[0]
        out: list[Outgoing] = []
        if batch.epoch == self._epochs.get(batch.shard, 0):
            told = answered.get(batch.shard) if answered else None
            out.append((batch.shard, msgs.done(batch.seq, answered=told)))
        self._forget_all()
        self.storage_full = False
        return out

    def failed(self, error: StorageError, now: float) -> list[Outgoing]:
        """The commit failed: schedule a retry with backoff.

        On `StorageFull`, return a `fail` for each current batch not yet told, so durable
        pushes waiting on it are answered with an error. A durable batch is dropped (its
        shard forgets its pushes: a client that retries must not find a duplicate once space
        returns); every other batch stays buffered (buffered pushes were already answered).
        """
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = now
        delay = min(self._retry_max, RETRY_FIRST_S * 2 ** (self.failures - 1))
        self._retry_at = self._probe_at = now + delay
        self.storage_full = isinstance(error, StorageFull)
        if not self.storage_full:
            return []
        out: list[Outgoing] = []
        for batch in self._batches:
            if not batch.told_fail and batch.epoch == self._epochs.get(batch.shard, 0):
                batch.told_fail = True
                out.append((batch.shard, msgs.fail(batch.seq, FULL_REASON)))
        self._drop_told_durable()
        return out

    def dropped(self, reason: str) -> list[Outgoing]:
        """Storage refused the waiting batches for good (fenced: the node lost the partitions
        they write, docs/cluster.md): forget them all. Returns a `fail` for each current
        batch, so a durable push waiting on it is answered with an error, and the `done` of
        each waiting sync (nothing is left for it to wait on)."""
        out: list[Outgoing] = [
            (batch.shard, msgs.fail(batch.seq, reason, dropped=True))
            for batch in self._batches
            if batch.epoch == self._epochs.get(batch.shard, 0)
        ]
        out.extend(self._synced_dones())
        self._forget_all()
        return out

    def _synced_dones(self) -> list[Outgoing]:
        """The `done` of each waiting sync of a shard's current epoch."""
        return [
            (shard, msgs.done(seq, synced=True))
            for shard, epoch, seq in self._syncs
            if epoch == self._epochs.get(shard, 0)
        ]

    def _forget_all(self) -> None:
        """Empty the buffer, and forget the failures and the retry it was waiting on."""
        self._muts = []
        self._bytes = 0
        self._ops = 0
        self._batches.clear()
        self._with_replies = 0
        self.drains = False
        self._syncs.clear()
        self._first_at = None
        self._urgent = False
        self._retry_at = None
        self.failures = 0
        self.failing_since = None

    def _drop_told_durable(self) -> None:
        muts: list[Mutation] = []
        kept: list[_Batch] = []
        start = 0
        for batch in self._batches:
            end = start + batch.size
            if not (batch.durable and batch.told_fail):
                kept.append(batch)
                muts.extend(self._muts[start:end])
            start = end
        if len(kept) == len(self._batches):
            return
        self._batches, self._muts = kept, muts
        self._with_replies = sum(batch.rep is not None for batch in kept)
        self._bytes = sum(batch.nbytes for batch in kept)
        self._ops = sum(batch.ops for batch in kept)
        if not kept:
            self._first_at = None
            self._urgent = False
            if not self._syncs:
                self._retry_at = None  # nothing left to retry; the next batch tries at once

    def owner(self, index: int) -> tuple[int, int, bool]:
        """(shard, seq, current) of the batch holding `mutations()[index]`; `current` is false
        for a batch of a shard's previous process (nobody waits for news of it)."""
        start = 0
        for batch in self._batches:
            if index < start + batch.size:
                return batch.shard, batch.seq, batch.epoch == self._epochs.get(batch.shard, 0)
            start += batch.size
        raise IndexError(f"no batch holds mutation {index}")

    def retry_in(self, now: float) -> float:
        """Seconds until the scheduled retry (0 if none is scheduled)."""
        return 0.0 if self._retry_at is None else max(0.0, self._retry_at - now)

    def _epoch(self, shard: int, seq: int, *, restart: bool) -> int:
        last = self._last_seq.get(shard)
        epoch = self._epochs.get(shard, 0)
        if restart or (last is not None and seq <= last):
            epoch += 1
            self._epochs[shard] = epoch
        self._last_seq[shard] = seq
        return epoch


_PUTM = 8  # a `putm`'s length: its keys are at 5 (`shardq.storage._encode`)


def _scan(mutations: list[Any]) -> tuple[int, bool]:  # what came off the wire: anything
    """How many more job mutations the `updm`s and `putm`s among `mutations` stand for than
    their count, and whether one of them is a `qdrain`."""
    extra = 0
    drains = False
    m: Any
    for m in mutations:  # anything may come: a malformed one is the store's to reject
        # `m and`, not a len(): a call for every mutation, and nearly all are not `updm`s.
        if type(m) is list and m:
            kind = m[0]
            if kind == "updm" and len(m) == 4 and type(m[3]) is list:
                extra += max(len(m[3]) - 1, 0)
            elif kind == "putm" and len(m) == _PUTM and type(m[5]) is list:
                extra += max(len(m[5]) - 1, 0)
            elif kind == "qdrain":
                drains = True
    return extra, drains


# The reason a shard puts after "Storage unavailable: " in a failed durable reply.
FULL_REASON = "database or disk is full"
