"""An in-memory cold backlog for engine tests: the storage's reads over a folded mutation stream.

`ModelBacklog` applies an engine's mutations (`feed`, then `commit`, which makes them what the
reads show: until then the reads lag, as a real storage's do until the writer commits) and
answers the reads of `shardq.core._cold.ColdBacklog` over the jobs stored with `cold` 1, in the
orders that module names. Records come back through msgpack, as a storage's do (tuples
become lists, nothing is shared with the engine).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack  # type: ignore[import-untyped]

from shardq.core import Mutation
from shardq.core._mutations import ROW_KEY_SEP, Record, fold_mutations

Cursor = tuple[Any, ...]


@dataclass(frozen=True)
class Page:
    records: list[Record]
    after: Cursor | None
    done: bool


@dataclass(frozen=True)
class Counts:
    waiting: int = 0
    delayed: int = 0
    group_waiting: dict[str, int] = field(default_factory=dict)
    group_delayed: dict[str, int] = field(default_factory=dict)
    prioritized: int = 0


def _row_key(rec: Record) -> str:
    return str(rec.get("rowKey") or rec["id"])


def waiting_key(rec: Record) -> Cursor:
    seq, lifo = int(rec["seq"]), 1 if rec.get("lifo") else 0
    run_at = rec.get("runAt") or 0
    return (-(rec.get("priority") or 0), -lifo, -seq if lifo else run_at, seq, _row_key(rec))


def delayed_key(rec: Record) -> Cursor:
    return (rec.get("runAt") or 0, int(rec["seq"]), _row_key(rec))


def made_key(rec: Record) -> Cursor:
    return (rec.get("createdAt") or 0, int(rec["seq"]), _row_key(rec))


class _Reversed:
    """A string that sorts in reverse (a descending page's row key)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __lt__(self, other: _Reversed) -> bool:
        return self.text > other.text

    def __gt__(self, other: _Reversed) -> bool:
        return self.text < other.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)


def _copy(rec: Record) -> Record:
    out: Record = msgpack.unpackb(msgpack.packb(rec), raw=False, strict_map_key=False)
    return out


class ModelBacklog:
    """The cold reads over committed mutations; `reads` counts them (a test may bound it)."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}  # by row key
        self.queued: list[Mutation] = []
        self.reads = 0

    def feed(self, mutations: list[Mutation]) -> None:
        self.queued.extend(mutations)

    def commit(self) -> None:
        fold_mutations([_copy_mutation(m) for m in self.queued], self.records)
        self.queued = []

    def settled(self) -> list[Record]:
        """The records as they will be once everything fed so far is committed."""
        records = {k: dict(v) for k, v in self.records.items()}
        fold_mutations([_copy_mutation(m) for m in self.queued], records)
        return list(records.values())

    # -- the reads -------------------------------------------------------------------------

    def _cold(self, queue: str, state: str) -> list[Record]:
        return [
            r
            for r in self.records.values()
            if r.get("cold") and r["queue"] == queue and r["state"] == state
        ]

    def _page(
        self, recs: list[Record], key: Any, after: Cursor | None, limit: int, max_bytes: int
    ) -> Page:
        assert 1 <= limit <= 100_000 and max_bytes >= 1
        self.reads += 1
        ordered = sorted(recs, key=key)
        if after is not None:
            ordered = [r for r in ordered if key(r) > after]
        taken, size = [], 0
        for rec in ordered:
            taken.append(rec)
            size += len(msgpack.packb(rec))
            if len(taken) >= limit or size >= max_bytes:
                break
        done = len(taken) == len(ordered)
        return Page([_copy(r) for r in taken], key(taken[-1]) if taken else None, done)

    def page_waiting(
        self, queue: str, after: Cursor | None = None, *, limit: int, max_bytes: int = 4 << 20
    ) -> Page:
        recs = [r for r in self._cold(queue, "waiting") if r.get("groupId") is None]
        return self._page(recs, waiting_key, after, limit, max_bytes)

    def page_group(
        self,
        queue: str,
        group: str,
        after: Cursor | None = None,
        *,
        limit: int,
        max_bytes: int = 4 << 20,
    ) -> Page:
        recs = [r for r in self._cold(queue, "waiting") if r.get("groupId") == group]

        def key(r: Record) -> Cursor:
            return (r.get("priority") or 0, r.get("runAt") or 0, int(r["seq"]), _row_key(r))

        return self._page(recs, key, after, limit, max_bytes)

    def page_delayed(
        self, queue: str, after: Cursor | None = None, *, limit: int, max_bytes: int = 4 << 20
    ) -> Page:
        return self._page(self._cold(queue, "delayed"), delayed_key, after, limit, max_bytes)

    def _kinds(self, queue: str, kinds: Any) -> list[Record]:
        assert kinds and set(kinds) <= {"waiting", "prioritized", "delayed"}, kinds
        out = []
        for rec in self._cold(queue, "waiting") + self._cold(queue, "delayed"):
            if rec["state"] == "delayed":
                kind = "delayed"
            elif rec.get("groupId") is not None:
                continue
            else:
                kind = "prioritized" if (rec.get("priority") or 0) > 0 else "waiting"
            if kind in kinds:
                out.append(rec)
        return out

    def page_made(
        self,
        queue: str,
        kinds: Any,
        after: Cursor | None = None,
        *,
        limit: int,
        desc: bool = False,
        max_bytes: int = 4 << 20,
    ) -> Page:
        recs = self._kinds(queue, kinds)
        if not desc:
            return self._page(recs, made_key, after, limit, max_bytes)

        def backwards(rec: Record) -> Cursor:
            made, seq, row = made_key(rec)
            return (-made, -seq, _Reversed(row))

        flipped = None if after is None else (-after[0], -after[1], _Reversed(after[2]))
        page = self._page(recs, backwards, flipped, limit, max_bytes)
        last = made_key(page.records[-1]) if page.records else None
        return Page(page.records, last, page.done)

    def page_by_seq(
        self,
        queue: str,
        kinds: Any,
        after: Cursor | None = None,
        *,
        limit: int,
        made_by: int | None = None,
        max_bytes: int = 4 << 20,
    ) -> Page:
        recs = self._kinds(queue, kinds)
        if made_by is not None:
            recs = [r for r in recs if (r.get("createdAt") or 0) <= made_by]
        return self._page(recs, lambda r: (int(r["seq"]), _row_key(r)), after, limit, max_bytes)

    def get_job(self, job_id: str) -> Record | None:
        self.reads += 1
        rec = self.records.get(job_id)  # by row key, as the storage's primary key
        return _copy(rec) if rec is not None else None

    def get_by_custom_id(self, queue: str, custom_id: str) -> Record | None:
        self.reads += 1
        rec = self.records.get(f"{custom_id}{ROW_KEY_SEP}{queue}")
        return _copy(rec) if rec is not None else None

    def find_unique(self, queue: str, unique_key: str, *, limit: int = 16) -> list[Record]:
        self.reads += 1
        found = [
            r
            for r in self.records.values()
            if r["queue"] == queue and r.get("uniqueKey") == unique_key
        ]
        return [_copy(r) for r in sorted(found, key=lambda r: int(r["seq"]))[:limit]]

    def cold_counts(self, queue: str) -> Counts:
        waiting = [r for r in self._cold(queue, "waiting") if r.get("groupId") is None]
        prioritized = sum(1 for r in waiting if (r.get("priority") or 0) > 0)
        return Counts(len(waiting), len(self._cold(queue, "delayed")), prioritized=prioritized)

    def cold_priorities(self, queue: str) -> dict[Any, int]:
        self.reads += 1
        recs = [r for r in self._cold(queue, "waiting") if r.get("groupId") is None]
        out: dict[Any, int] = {}
        for rec in recs + self._cold(queue, "delayed"):
            key = rec.get("priority") or 0
            out[key] = out.get(key, 0) + 1
        return out


def _copy_mutation(m: Mutation) -> Mutation:
    # The writer stores encoded bytes: nothing it holds is shared with the engine.
    return tuple(msgpack.unpackb(msgpack.packb(list(m)), raw=False, strict_map_key=False))
