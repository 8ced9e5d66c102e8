"""`copy_store`: everything one store holds, written into another, empty one.

`shardq storage copy` moves a server's SQLite file into PostgreSQL with it (docs/postgres.md,
"Moving an existing server"). It goes through the storage contract, not the tables: it reads
what a recovering shard reads (`load_queues`, `load_crons`, `load_webhooks`,
`load_flow_outbox`, `load_jobs`) and writes it with the mutations the writer applies
(`queue`, `group`, `cron`, `webhook`, `flow`, and a `put` of each job's whole record), a
batch per `apply`, so one transaction each. What the target then holds is what a server
recovering from the source would load, whatever either backend's rows look like: a job's
appended changes and delta rows (log lines, children's results) arrive folded into its record.

Afterwards the rows of every table recovery reads, and the jobs per state, are counted on both
sides (`row_counts`); `CopyResult.mismatches` names any that differ.

A Drain's range still being deleted in the source (`_drain_pending`) is not copied: recovery
does not read its rows, nor do the counts count them (`_counts.DRAINED_SQL`), and the target
starts with nothing pending.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core._flows import notice_key
from shardq.core._mutations import Mutation, Record
from shardq.core._record import drop_defaults
from shardq.storage._contract import Storage
from shardq.storage._counts import COUNTED_TABLES
from shardq.storage._encode import MutationEncoder
from shardq.storage._errors import StorageError

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_BATCH_BYTES",
    "CopyResult",
    "Countable",
    "TargetNotEmpty",
    "copy_store",
]

DEFAULT_BATCH = 1000
"""Rows per transaction: big enough that a commit's cost is spread thin, small enough that a
failure loses little time and the progress line moves."""
DEFAULT_BATCH_BYTES = 8 << 20
"""Encoded bytes per transaction: what one batch holds in memory at most (past one record)."""

# Jobs read from the source per query (as recovery reads them): a few MB of records.
READ_PAGE = 1000

Progress = Callable[[int, int], None]


class Countable(Storage, Protocol):
    """A store that can count its rows (both backends can; the contract does not ask it)."""

    def row_counts(self) -> dict[str, int]: ...


class TargetNotEmpty(StorageError):
    """The target already holds data: a copy never merges into it."""


@dataclass(frozen=True)
class CopyResult:
    """What a copy read, wrote and counted afterwards."""

    source: dict[str, int]
    """`row_counts()` of the source, before the copy."""
    target: dict[str, int]
    """`row_counts()` of the target, after it."""
    copied: dict[str, int]
    """Rows written per table (`COUNTED_TABLES`)."""
    seconds: float

    @property
    def rows(self) -> int:
        return sum(self.copied.values())

    def mismatches(self) -> list[str]:
        """One line per count that differs between the source and the target, or between
        the source and what was written; empty when the copy is verified."""
        lines = []
        for key in sorted(self.source.keys() | self.target.keys()):
            source, target = self.source.get(key, 0), self.target.get(key, 0)
            if source != target:
                lines.append(f"{key}: source {source}, target {target}")
        for table, written in self.copied.items():
            if written != self.source.get(table, 0):
                lines.append(f"{table}: source {self.source.get(table, 0)}, written {written}")
        return lines


def copy_store(
    source: Countable,
    target: Countable,
    *,
    batch: int = DEFAULT_BATCH,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    progress: Progress | None = None,
) -> CopyResult:
    """Copy everything `source` holds into `target`, which must hold nothing.

    Writes batches of at most `batch` rows and about `batch_bytes` encoded bytes, each one
    `apply` (one transaction), and calls `progress(rows written, rows in all)` after each.
    Raises `TargetNotEmpty` (before writing anything) if the target holds a row of a counted
    table, `ValueError` for a batch bound below 1, and `StorageError` if a read or a write
    fails: the target then holds the batches written before, and must be emptied before a new
    copy (the message says how many rows it holds).
    """
    if batch < 1 or batch_bytes < 1:
        raise ValueError(f"batch and batch_bytes must be at least 1, got {batch}, {batch_bytes}")
    started = time.monotonic()
    before = source.row_counts()
    held = {key: n for key, n in target.row_counts().items() if n and ":" not in key}
    if held:
        listed = ", ".join(f"{n} rows in {key}" for key, n in held.items())
        raise TargetNotEmpty(
            f"the target already holds data ({listed}); a copy never merges: "
            "copy into an empty database or schema"
        )
    total = sum(before.get(table, 0) for table in COUNTED_TABLES)
    copied = dict.fromkeys(COUNTED_TABLES, 0)
    for tally, mutations in _batches(source, batch, batch_bytes):
        try:
            target.apply(mutations)
        except StorageError as e:
            done = sum(copied.values())
            raise type(e)(
                f"{e} (after {done} of {total} rows: the target holds a partial copy; "
                "empty it before copying again)"
            ) from e
        for table, n in tally.items():
            copied[table] += n
        if progress is not None:
            progress(sum(copied.values()), total)
    return CopyResult(before, target.row_counts(), copied, time.monotonic() - started)


def _batches(
    source: Storage, batch: int, batch_bytes: int
) -> Iterator[tuple[dict[str, int], list[Mutation]]]:
    """(rows per table, mutations) of each batch, in the order `_rows` reads them."""
    tally: dict[str, int] = {}
    mutations: list[Mutation] = []
    size = 0
    # Jobs are read a page at a time, whatever the batch: a page is decoded records in memory.
    for table, mutation, nbytes in _encoded(source, page=min(batch, READ_PAGE)):
        mutations.append(mutation)
        tally[table] = tally.get(table, 0) + 1
        size += nbytes
        if len(mutations) >= batch or size >= batch_bytes:
            yield tally, mutations
            tally, mutations, size = {}, [], 0
    if mutations:
        yield tally, mutations


def _encoded(source: Storage, page: int) -> Iterator[tuple[str, Mutation, int]]:
    """(table, mutation, its encoded size) of every row: jobs encoded as a shard sends them
    (`putb`: the writer stores the bytes as they are), the rest as the engine makes them."""
    encode = MutationEncoder().encode
    pack = msgpack.Packer(use_bin_type=True).pack
    for table, mutation in _rows(source, page):
        if table == "jobs":
            (encoded,) = encode([mutation])
            # The record's bytes (a cold record's cold fields follow them: `_encode`).
            yield table, encoded, len(encoded[7]) if encoded[0] == "putb" else 0
        else:
            yield table, mutation, len(pack(mutation[-1]))


def _rows(source: Storage, page: int) -> Iterator[tuple[str, Mutation]]:
    """(table, mutation) for every row recovery would read, small tables first."""
    for name, cfg in source.load_queues().items():
        own = {key: value for key, value in cfg.items() if key != "groups"}
        groups = cfg.get("groups") or {}
        # The engine never stores an empty queue config: a queue with groups and nothing
        # else of its own has no `queue_state` row (the counts would show it otherwise).
        if own or not groups:
            yield "queue_state", ("queue", name, own)
        for gid, settings in groups.items():
            yield "queue_groups", ("group", name, gid, settings)
    for rec in source.load_crons():
        yield "cron_jobs", ("cron", _key(rec, "name", "cron schedule"), rec)
    for rec in source.load_webhooks():
        yield "webhooks", ("webhook", _key(rec, "id", "webhook"), rec)
    for notice in source.load_flow_outbox():
        try:
            key = notice_key(notice)
        except KeyError as e:
            raise StorageError(f"a stored flow notice has no {e}: {notice!r:.200}") from None
        yield "flow_outbox", ("flow", key, notice)
    for rec in source.load_jobs(page_size=page):
        yield "jobs", ("put", drop_defaults(rec))  # written as a shard writes a record


def _key(rec: Record, field: str, what: str) -> str:
    key = rec.get(field)
    if not isinstance(key, str):
        raise StorageError(f"a stored {what} has no {field}: {rec!r:.200}")
    return key
