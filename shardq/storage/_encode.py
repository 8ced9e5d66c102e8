"""Mutations as the writer takes them: records and changes already msgpack-encoded.

A shard must encode its mutations to send them anyway. `MutationEncoder` encodes each job
record and each change map on its own, and puts the few fields the writer needs for its
columns beside the bytes, so the writer stores the bytes as they came and never decodes a job:

    ("putb", row_key, queue, state, priority, run_at, seq, rec)  for ("put", rec)
    ("putb", row_key, queue, state, priority, run_at, seq, rec, [lifo, gid, ukey])
                                                                 for a cold record's put
    ("putm", queue, state, priority, run_at, [row_key, ...], [seq, ...], [rec, ...])
                                                                 for a run of fresh `put`s
    ("updb", row_key, changes, columns)                          for ("upd", row_key, changes)
    ("updm", changes, columns, [row_key, ...])                   for a run of such `upd`s
    ("dltb", row_key, op)                                        for ("delta", row_key, op)

`updm` stands for consecutive `upd`s of one change map object: jobs moved together (a PULLB or
an ACKB of jobs pushed together) share one payload (`shardq.core._mutations`), and the map, its
columns and the list around each key made up most of what a drained job cost on the wire (169
bytes an update, 39 as a key of an `updm`) and most of what the writer decoded for it. It is
exactly those `upd`s in that order. A run is cut at `max_group_keys` keys and at about
`max_group_bytes` bytes of keys and map, so one stays far inside a shard's batch bounds.

`putm` is the same for fresh jobs' puts (a PUSHB's, or a turn's PUSHes): consecutive ones
whose queue, state, priority and run_at are equal (priority and run_at ints: `_runs_of`) go as
one mutation with those four once, and each job's row key, seq and record in three lists of
one length: exactly the `putb` of each in that order. It saves the shard packing, and the writer
unpacking, parsing and checking, five values and a list header a job. A run is cut as an
`updm` is; a lone fresh put and a cold record's put stay `putb`s.

`rec` and `changes` are the msgpack encodings (`use_bin_type=True`) of the engine's record and
change map. `columns` holds the column fields the changes set, under their record names
(`queue`, `state`, `priority`, `runAt`, `seq`), and is usually `{"state": ...}`; a change
that names a cold field adds `cold` there (`shardq.storage._cold` says what it holds). A cold
record's put (`"cold"` true) carries the four fields of its cold columns the same way. "del",
"queue" and "qdel" are small and pass through unchanged, as does any mutation the encoder
cannot vouch for (a missing row key, a mistyped column field): the writer then rejects it with
the same error as before. A batch may mix both forms; `Store.apply` takes either.

The meaning is exactly that of the engine's shapes (`shardq.core._mutations`): `putb` is the
`put` of the record `rec` decodes to, `updb` the `upd` of those changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby
from operator import itemgetter
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core._fresh import PackedRecord
from shardq.core._mutations import Mutation
from shardq.storage._cold import COLD_COLUMN, COLD_KEYS, cold_mark, cold_of

__all__ = [
    "COLUMN_FIELDS",
    "DEFAULT_GROUP_BYTES",
    "DEFAULT_GROUP_KEYS",
    "PUTM_JOB_BYTES",
    "UPDM_KEY_BYTES",
    "MutationEncoder",
    "describe",
    "put_keys",
]

UPDM_KEY_BYTES: Final = 5
"""Bytes an `updm` spends around each of its keys (a string header), counted in
`encoded_bytes` with the key: a shard's batch bounds need no allowance per key."""
PUTM_JOB_BYTES: Final = 20
"""Bytes a `putm` spends on each job beyond its key and record (the key's and the record's
headers, its seq), counted in `encoded_bytes` as `UPDM_KEY_BYTES` is."""
DEFAULT_GROUP_KEYS: Final = 1000
"""At most this many keys in one `updm` (a shard passes its `writer_batch_max_mutations`)."""
DEFAULT_GROUP_BYTES: Final = 64 * 1024
"""About at most this many bytes of keys and change map in one `updm` (a shard passes a
part of its `writer_batch_max_bytes`)."""

COLUMN_FIELDS: Final[tuple[str, ...]] = ("queue", "state", "priority", "runAt", "seq")
"""The record fields that the `jobs` table also keeps in columns, for queries and recovery order."""

# Column fields that are NOT NULL in the table, and the type each must have.
_TYPED: Final[tuple[tuple[str, type], ...]] = (("queue", str), ("state", str), ("seq", int))


class MutationEncoder:
    """Turns the engine's mutations into the writer's encoded form. One per thread."""

    def __init__(
        self,
        max_group_keys: int = DEFAULT_GROUP_KEYS,
        max_group_bytes: int = DEFAULT_GROUP_BYTES,
    ) -> None:
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self._max_keys = max(1, max_group_keys)
        self._max_bytes = max_group_bytes
        # Of the last `encode`: the summed length of the encoded mutations' keys and blobs
        # (with `UPDM_KEY_BYTES` for each key an `updm` adds), and how many mutations were
        # left as they were. A shard bounds its batches in bytes
        # from these without walking the batch again (`shardq.runtime.shard._batches`).
        self.encoded_bytes = 0
        self.unencoded = 0

    def encode(self, mutations: Iterable[Mutation]) -> list[Mutation]:
        """The batch with every well-formed `put` and `upd` encoded; the rest unchanged.

        Raises `TypeError` (from msgpack) for a value msgpack cannot encode, as packing the
        whole batch would.
        """
        pack = self._pack
        out: list[Mutation] = []
        append = out.append
        # Jobs moved together share one change map (a PULLB of 100 emits 100 `upd`s of one
        # payload, see `shardq.core._mutations`), so the last map's encoding is reused while
        # the same object comes again: one pack per batch instead of one per job.
        last: object = None
        last_enc: tuple[bytes, dict[str, Any]] | None = None
        size = unencoded = 0
        # The `updb` or `updm` of `last` that a next `upd` of it may join: its index in `out`,
        # its keys (None while it is still an `updb`) and its bytes so far.
        group_at, group, group_bytes = -1, None, 0
        max_keys, max_bytes = self._max_keys, self._max_bytes
        muts = mutations if type(mutations) is list else list(mutations)
        at, end = 0, len(muts)
        while at < end:
            m = muts[at]
            at += 1
            kind = m[0] if m else None
            if kind == "upd" and len(m) == 3:
                key, changes = m[1], m[2]
                if type(key) is str:
                    if changes is not last:
                        last, last_enc = changes, _encode_changes(changes, pack)
                    elif last_enc is not None and group_at == len(out) - 1:
                        if group is None:  # the second of a run: the `updb` becomes an `updm`
                            group = [out[group_at][1]]
                            out[group_at] = ("updm", *last_enc, group)
                        # This key, and the `upd`s of the same map right after it (a PULLB's
                        # or an ACKB's jobs) without a pass of this loop each (`_run_keys`).
                        taken, added = _run_keys(muts, at - 1, last, group, max_keys - len(group),
                                                 max_bytes - group_bytes)  # fmt: skip
                        at += taken - 1
                        size += added
                        group_bytes += added
                        if len(group) >= max_keys or group_bytes >= max_bytes:
                            group_at = -1  # full: the next one starts a run of its own
                        continue
                    if last_enc is not None:
                        append(("updb", key, *last_enc))
                        size += len(key) + len(last_enc[0])
                        group_at, group = len(out) - 1, None
                        group_bytes = len(key) + len(last_enc[0])
                        continue
            elif kind == "delta" and len(m) == 3:
                if type(m[1]) is str and type(m[2]) is dict:
                    blob = pack(m[2])
                    append(("dltb", m[1], blob))
                    size += len(m[1]) + len(blob)
                    continue
            elif kind == "put" and len(m) == 2:
                # This put and the fresh jobs' puts right after it (a PUSHB's), without a pass
                # of this loop and two calls each (`_fresh_puts`).
                taken, added = _puts(muts, at - 1, out, pack, max_keys, max_bytes)
                if taken:
                    at += taken - 1
                    size += added
                    continue
            append(m)
            unencoded += 1
        self.encoded_bytes, self.unencoded = size, unencoded
        return out


def _run_keys(
    muts: list[Mutation], at: int, changes: object, group: list[str], keys: int, room: int
) -> tuple[int, int]:
    """Append to `group` the key of `muts[at]` (an `upd` of `changes`) and of the `upd`s of
    that same map that follow it, up to `keys` keys and until their bytes reach `room`, as
    `encode`'s loop would one by one. Only the engine's own tuples are taken: a list or any
    other shape ends the run, for `encode` to look at. Returns how many it took (at least
    one) and their bytes."""
    key = muts[at][1]
    taken = added = 0
    end = len(muts)
    while True:
        group.append(key)
        added += len(key) + UPDM_KEY_BYTES
        taken += 1
        at += 1
        if taken >= keys or added >= room or at == end:
            return taken, added
        m = muts[at]
        if type(m) is not tuple or len(m) != 3 or m[2] is not changes:
            return taken, added
        key = m[1]
        if m[0] != "upd" or type(key) is not str:
            return taken, added


def _puts(
    muts: list[Mutation], at: int, out: list[Mutation], pack: Any, keys: int, room: int
) -> tuple[int, int]:
    """Append to `out` the `putb` of the `put` at `muts[at]`, or the `putm`s and `putb`s of
    the fresh jobs' puts from it on (`_fresh_puts`, runs of at most `keys` jobs and about
    `room` bytes). Returns how many it took (none if the first has no row key or a mistyped
    column field: `encode` leaves it as it is) and the bytes of their keys and records."""
    taken, added = _fresh_puts(muts, at, out, keys, room)
    if taken:
        return taken, added
    put = _encode_put(muts[at][1], pack)
    if put is None:
        return 0, 0
    out.append(put)
    return 1, len(put[1]) + len(put[7])


def _fresh_puts(
    muts: list[Mutation], at: int, out: list[Mutation], keys: int, room: int
) -> tuple[int, int]:
    """Append to `out` the writer's form of each fresh job's `put` from `muts[at]` on (a
    record still as made, whose `putb` was made with it, `_encode_fresh`), until a mutation
    of any other kind or shape (an engine tuple `("put", PackedRecord)` with its made keys
    and a `putb` only): a `putm` for each run of them with equal column values (`_runs_of`),
    a `putb` for a run of one. Returns how many it took (perhaps none) and the bytes of their
    keys and records (with `PUTM_JOB_BYTES` for each job of a `putm`)."""
    start = at
    end = len(muts)
    putbs: list[tuple[Any, ...]] = []
    append = putbs.append
    while at < end:
        m = muts[at]
        if type(m) is not tuple or len(m) != 2 or m[0] != "put":
            break
        rec = m[1]
        if type(rec) is not PackedRecord or len(rec) != rec.made_keys:
            break
        putb = rec.putb
        if putb is None:
            break
        append(putb)
        at += 1
    if not putbs:
        return 0, 0
    if len(putbs) == 1:
        out.append(putbs[0])
        return 1, len(putbs[0][1]) + len(putbs[0][7])
    added = 0
    # Runs of equal queue, state, priority and run_at, found in C (`_runs_of` checks types).
    for _, run in groupby(putbs, _COLUMNS_OF):
        added += _runs_of(list(run), out, keys, room)
    return at - start, added


_COLUMNS_OF: Final = itemgetter(2, 3, 4, 5)
_INT: Final = frozenset((int,))


def _runs_of(run: list[tuple[Any, ...]], out: list[Mutation], keys: int, room: int) -> int:
    """Append to `out` the `putm` of `run` (`putb`s whose column values are equal), or its
    `putb` if it holds one; several if it is over `keys` jobs or about `room` bytes, and a
    `putb` each if its priorities or run_ats are not all ints (equal values of other types
    may store differently: 0, 0.0 and False, 0.0 and -0.0). Returns the bytes of their keys
    and records, with `PUTM_JOB_BYTES` for each job of a `putm`."""
    if len(run) == 1:
        out.append(run[0])
        return len(run[0][1]) + len(run[0][7])
    # One transposition in C: the keys, seqs and records of the run (tuples, packed as arrays).
    _, row_keys, _, _, priorities, run_ats, seqs, recs = zip(*run, strict=True)
    size = sum(map(len, row_keys)) + sum(map(len, recs))
    if set(map(type, priorities)) != _INT or set(map(type, run_ats)) != _INT:
        out.extend(run)
        return size
    size += PUTM_JOB_BYTES * len(run)
    if len(run) > keys or size > room:  # rare: a huge PUSHB, in pieces
        half = max(1, min(keys, len(run) // 2))
        return _runs_of(run[:half], out, keys, room) + _runs_of(run[half:], out, keys, room)
    head = run[0]
    out.append(("putm", head[2], head[3], head[4], head[5], row_keys, seqs, recs))
    return size


def _encode_put(rec: object, pack: Any) -> Mutation | None:
    """The `putb` of a record, or None if it has no row key or a mistyped column field.

    A record the engine made with its encoding (`PackedRecord`, a fresh job's) is not packed
    again while it holds the keys it was made with: its only later change adds a key."""
    if type(rec) is PackedRecord:
        if len(rec) == rec.made_keys:
            return _encode_fresh(rec)
        return _encode_record(rec, pack)
    if type(rec) is not dict:
        return None
    return _encode_record(rec, pack)


def _encode_record(rec: dict[str, Any], pack: Any) -> Mutation | None:
    key = rec.get("rowKey") or rec.get("id")
    queue, state, seq = rec.get("queue"), rec.get("state"), rec.get("seq")
    if type(key) is str and type(queue) is str and type(state) is str and type(seq) is int:
        if rec.get(COLD_COLUMN):  # a job the engine keeps on disk only (`_cold`)
            columns = (key, queue, state, rec.get("priority", 0), rec.get("runAt"), seq)
            return ("putb", *columns, pack(rec), cold_of(rec))
        priority = rec.get("priority", 0)  # a record leaves a default out (`core._record`)
        return ("putb", key, queue, state, priority, rec.get("runAt"), seq, pack(rec))
    return None


def _encode_fresh(rec: PackedRecord) -> Mutation | None:
    """`_encode_put` of a fresh job's record: the `putb` made with it (`PackedRecord.putb`:
    its own bytes, no cold field as it has no key beyond the fresh ones, the row key its id),
    None if a column field is mistyped."""
    return rec.putb


def _encode_changes(changes: object, pack: Any) -> tuple[bytes, dict[str, Any]] | None:
    """(encoded changes, their column fields), or None if they are no map or mistyped."""
    if type(changes) is not dict:
        return None
    columns = _columns_of(changes)
    if columns is None:
        return None
    return pack(changes), columns


def _columns_of(changes: dict[str, Any]) -> dict[str, Any] | None:
    """The column fields `changes` sets, or None if one of them is mistyped."""
    columns = {name: changes[name] for name in COLUMN_FIELDS if name in changes}
    if not COLD_KEYS.isdisjoint(changes):  # inline: runs for every change map a shard sends
        columns[COLD_COLUMN] = cold_mark(changes)
    for name, kind in _TYPED:
        if name in columns and type(columns[name]) is not kind:
            return None
    return columns


def describe(mutation: object) -> tuple[str, str | None]:
    """(kind, key) of a mutation in either shape: kind "put", "upd", "delta", "del", "queue"
    or "qdel"; key the job's row key (or the queue's name). Tolerates malformed mutations: a
    rejected one may be anything (kind "?" and key None when unrecognisable)."""
    if not isinstance(mutation, list | tuple) or not mutation:
        return "?", None
    kind: Any = mutation[0]
    key: Any = mutation[1] if len(mutation) > 1 else None
    if kind == "put" and isinstance(key, dict):
        key = key.get("rowKey") or key.get("id")
    if kind == "updm" or kind == "putm":
        keys = mutation[_KEYS_AT[kind]] if len(mutation) > _KEYS_AT[kind] else None
        key = keys[0] if isinstance(keys, list | tuple) and keys else None  # its first job's
    kind = _KINDS.get(kind, kind) if isinstance(kind, str) else kind
    return (
        kind if isinstance(kind, str) else "?",
        key if isinstance(key, str) else None,
    )


# The engine's kind of each encoded kind, and where an `updm`'s or a `putm`'s keys are.
_KINDS: Final = {"putb": "put", "putm": "put", "updb": "upd", "updm": "upd", "dltb": "delta"}
_KEYS_AT: Final = {"updm": 3, "putm": 5}


def put_keys(mutation: object) -> list[str]:
    """The row keys of the jobs a mutation in either shape puts: one for a `put` or a `putb`,
    each of a `putm`'s; none for any other kind (or a malformed one)."""
    kind, key = describe(mutation)
    if kind != "put":
        return []
    if mutation[0] == "putm":  # type: ignore[index]  # `describe` saw a list or tuple
        keys = mutation[5]  # type: ignore[index]
        return [one for one in keys if isinstance(one, str)]
    return [key] if key is not None else []
