"""`Store`: the SQLite file the writer owns, and the recovery reads.

How a job is stored, and why. The writer is the one process every job passes through, so its
work per job bounds the server. A row holds the job's columns (queue, state, priority, run_at,
seq: for queries and recovery order) and two msgpack blobs:

- `rec`: the whole record as of its last `put` (or its last fold, see `_write`);
- `patch`: every change since, as encoded change maps one after the other, each after its
  length. The stored record is `rec` with each change merged in, in order (`load_jobs`,
  `get_job`).

Shards send puts and updates already encoded (`shardq.storage._encode`), so on the hot path
the writer decodes no record and no change map and encodes nothing: a put is stored as the
bytes that came, and an update appends its bytes to `patch` in SQL and sets the columns it
changed. The writer only needs to know, per job, whether it exists, its queue and the lengths
of its blobs: a few bytes per job, cached for recently written jobs and otherwise read from
the columns, never from the blobs.

The alternative of one merged patch map per job (cached, merged and re-encoded by the writer
on every update) keeps `patch` bounded without folding, but decodes each incoming change and
encodes a patch per update, which is most of what the writer spends per job once puts come
pre-encoded. Appending is cheaper; its cost, a patch that grows with every change, is bounded
by folding it into `rec` once it outgrows the record.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core._mutations import Mutation, Record
from shardq.storage import _schema
from shardq.storage import _seq_reads as _seq
from shardq.storage._coalesce import DrainInBatch, Plan, Stored, coalesce, expand_runs
from shardq.storage._cold_reads import HOT_SET, SQLITE, ColdReads
from shardq.storage._contract import Storage
from shardq.storage._counts import count_rows
from shardq.storage._deltas import delta_lengths, read_deltas
from shardq.storage._drain import (
    DRAIN_CHUNK_ROWS,
    Done,
    apply_steps,
    remember_steps,
)
from shardq.storage._drain_bounds import BY_ID, drained_row
from shardq.storage._errors import StorageError, wrap_error
from shardq.storage._lone import NO_PLAN, lone_known, lone_put, lone_sql
from shardq.storage._put_only import put_rows, write_put_rows
from shardq.storage._store_drain import StoreDrains, not_drained
from shardq.storage._store_file import PROGRESS_STEPS, StoreFile, beating
from shardq.storage._store_loads import (
    _NOTHING,
    GROUPS_VERSION,
    MAX_FILTER_QUEUES,
    StoreLoads,
    _filter,
)
from shardq.storage._tx import autocommit, transaction
from shardq.storage._write import FETCH_CHUNK, chunks, merge_row, write_plan
from shardq.storage._write_puts import COLD_COLUMNS

__all__ = ["MAX_FILTER_QUEUES", "Store"]

# Recovery holds one page of decoded records at a time; 1000 keeps that to a few MB.
DEFAULT_PAGE_SIZE = 1000
# Jobs whose queue and blob lengths are kept, so an update of a job written a moment ago needs
# no read. About 250 bytes each (measured): the default holds 25 MB at most.
DEFAULT_CACHE_RECORDS = 100_000
# A patch is folded into its record once longer than both the record and this many bytes.
DEFAULT_PATCH_FLOOR = 1024


class Store(StoreFile, StoreDrains, StoreLoads, ColdReads):
    """The shardq database: jobs and queue configs, written in batches of mutations.

    Create one with `Store.open`. A `Store` belongs to one thread (sqlite3's default check)
    and, for writing, to one process: the writer. Use it as a context manager to close it.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        version: int,
        cache_records: int = DEFAULT_CACHE_RECORDS,
        patch_floor: int = DEFAULT_PATCH_FLOOR,
    ) -> None:
        """Use `Store.open`; this only takes ownership of an already configured connection."""
        self._conn = conn
        self._path = path
        self._version = version
        self._packer = msgpack.Packer(use_bin_type=True)
        self._skipped_updates = 0
        # What this store knows of the rows it wrote last (queue, rec and patch lengths), so
        # the `upd` of a job pushed a moment ago needs no read. Valid because this connection
        # is the only writer; updated only after a commit succeeded.
        # A plain dict in use order (a touched job is moved to the end), trimmed in halves.
        self._cache: dict[str, Stored] = {}
        self._cache_limit = cache_records
        # What the last commit taught the cache, until `settle` (or the next batch) learns it.
        self._unsettled: Done | None = None
        self._patch_floor = patch_floor
        # Rows in `job_deltas` (shardq.storage._deltas): while there are none, deleting or
        # replacing a job needs no look there, and recovery merges no ops.
        # (A store opened at an older schema version, as tests do, has no such table.)
        self._delta_rows = self._count_deltas() if version >= _schema.DELTAS_VERSION else 0
        # Reads in seq order go over the split seq indexes (`_seq_reads`) from this version on.
        self._split_seq = version >= _schema.SEQ_VERSION
        self._counts_table = version >= _schema.COUNTS_VERSION
        self._deltas_table = version >= _schema.DELTAS_VERSION
        self._pragmas: dict[str, Any] | None = None  # how `open` configured `_conn`
        self.drain_chunk = DRAIN_CHUNK_ROWS
        """Rows per statement of a `qdrain`'s range deletion done at once (`_drain`)."""
        self._drain_table = version >= _schema.DRAIN_VERSION
        self._open_drains()
        self._swap_lock: int | None = None  # `keep_swap_lock`'s descriptor
        self._lone_sql = lone_sql(_schema.cold_columns(version))  # `_apply_lone_put`
        self._cold = _schema.cold_columns(version)  # `_apply_puts`: the newest schema's only

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "normal",
        max_bytes: int | None = None,
        cache_records: int = DEFAULT_CACHE_RECORDS,
        patch_floor: int = DEFAULT_PATCH_FLOOR,
        cache_mb: int = _schema.DEFAULT_CACHE_MB,
        mmap_mb: int = _schema.DEFAULT_MMAP_MB,
        progress: Callable[[], None] | None = None,
    ) -> Store:
        """Open (creating it if needed) the database at `path` and migrate it.

        `synchronous` is "normal" (survives any process crash) or "full" (also survives power
        loss, at about 4x the cost of a small commit). `max_bytes` caps the file size: writes
        beyond it fail with `StorageFull` (None = no cap, the disk is the limit).
        `cache_records` bounds the jobs whose row summary is kept in memory (0 = none).
        `patch_floor`: a job's patch is folded into its record once it is longer than both
        the record and this many bytes. `cache_mb` and `mmap_mb` size SQLite's page cache
        and memory map (`_schema.configure`). `progress` is called now and then while the
        migrations run (`set_progress`; the writer tells the supervisor it is alive: building
        an index over millions of rows is one long statement).

        Raises `StorageError` if the directory cannot be created or written, the file is not a
        SQLite database, its schema is newer than this code knows, or `synchronous` is unknown.
        """
        _schema.synchronous_mode(synchronous)  # reject a bad setting before touching the disk
        path = Path(path)
        _prepare_directory(path.parent)
        try:
            conn = sqlite3.connect(path, isolation_level=None)
        except sqlite3.Error as e:
            raise wrap_error(e, f"opening {path}") from e
        pragmas: dict[str, Any] = {
            "synchronous": synchronous,
            "max_bytes": max_bytes,
            "cache_mb": cache_mb,
            "mmap_mb": mmap_mb,
        }
        try:
            _schema.configure(conn, **pragmas)
            if progress is not None:
                conn.set_progress_handler(beating(progress), PROGRESS_STEPS)
            version = _schema.migrate(conn)
            conn.set_progress_handler(None, 0)
        except Exception as e:
            conn.close()
            if isinstance(e, StorageError):
                raise type(e)(f"opening {path}: {e}") from e
            raise wrap_error(e, f"opening {path}") from e
        store = cls(conn, path, version, cache_records, patch_floor)
        store._pragmas = pragmas  # `_reopen` configures a fresh connection alike
        return store

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def schema_version(self) -> int:
        """The schema version the database is at (the number of migrations applied)."""
        return self._version

    @property
    def skipped_updates(self) -> int:
        """How many committed `upd` mutations found no job to update (since open)."""
        return self._skipped_updates

    def apply(self, mutations: Sequence[Mutation]) -> int:
        """Apply one batch of mutations atomically; return the number of rows written.

        Mutations come in the engine's shapes (`shardq.core._mutations`) or encoded by a
        shard (`shardq.storage._encode`), mixed freely. The batch is first coalesced (see
        `shardq.storage._coalesce`): a job put and updated in the same batch is written once.
        The result equals applying the mutations one by one. Rows written counts inserted,
        updated and deleted rows of both tables; an `upd` of a job that does not exist is
        skipped and counted in `skipped_updates`.

        Raises `StorageFull` if the disk (or `max_bytes`) is full, and `StorageError` for a
        malformed mutation, a record msgpack cannot encode, or any other SQLite failure. In
        every case the database is left exactly as it was before the call.
        """
        if not mutations:
            return 0
        if self._unsettled is not None:  # `settle`'s own test, without its call
            self.settle()
        if not (self._delta_rows or self._pending):
            row = lone_put(mutations)
            if row is not None:
                return self._apply_lone_put(row)
            puts = put_rows(mutations) if self._cold == COLD_COLUMNS else None
            if puts is not None:
                return self._apply_puts(*puts)
        self._begin_drains()
        action = f"applying a batch of {len(mutations)} mutations"
        done: Done
        with transaction(self._conn, action):
            try:
                plan = coalesce(mutations, self._fetch_stored, runs=True, cached=self._cache)
            except DrainInBatch:
                written, delta_rows, done = apply_steps(mutations, self._segment, self._drain)
            else:
                written, delta_rows, known = self._write(plan, self._delta_rows > 0)
                done = [(plan, known)]
        self._commit_drains()
        self._delta_rows = max(0, self._delta_rows + delta_rows)
        self._unsettled = done  # `settle`: after the writer has sent its `done`
        self._skipped_updates += sum(p.skipped for p, _ in done if isinstance(p, Plan))
        return written

    def _apply_lone_put(self, row: tuple[Any, ...]) -> int:
        """A batch of one encoded hot put (a lone durable push, `_lone`) while no Drain range
        is pending and no job has ops: its one upsert, which SQLite's autocommit commits as
        it ends (the same write lock, WAL frames and sync as BEGIN IMMEDIATE ... COMMIT; 6 %
        of the writer's instructions a durable push fewer, bench/results/2026-12-06-s20-dwriter.md)
        and rolls back whole if it fails, without the coalescing and the plan of `apply`."""
        written = autocommit(self._conn, self._lone_sql, row, "applying a batch of 1 mutations")
        self._unsettled = [(NO_PLAN, lone_known(row))]
        return written

    def _apply_puts(self, rows: list[tuple[Any, ...]], known: dict[str, Stored | None]) -> int:
        """A batch of fresh jobs' puts only (`_put_only`) while no Drain range is pending and
        no job has ops: their rows, written as `write_plan` writes them, without the plan."""
        with transaction(self._conn, f"applying a batch of {len(rows)} puts"):
            written = write_put_rows(self._conn, rows)
        self._unsettled = [(NO_PLAN, known)]
        return written

    def settle(self) -> None:
        """Update the cache of row summaries with what the last `apply` wrote. `apply` does
        it first itself; the writer calls it once it has confirmed the commit, so that no
        durable push waits on it."""
        done, self._unsettled = self._unsettled, None
        if done is not None:
            self._cache = remember_steps(self._cache, self._cache_limit, done)

    def _segment(
        self, mutations: Sequence[Mutation], first: bool
    ) -> tuple[int, int, Plan, dict[str, Stored | None]]:
        """One step of a batch holding a `qdrain` (`_drain.apply_steps`)."""
        plan = coalesce(mutations, self._fetch_stored if first else self._read_stored, runs=True)
        written, delta_rows, known = self._write(plan, self._delta_rows > 0 or self._deltas_table)
        return written, delta_rows, plan, known

    def _write(self, plan: Plan, deltas: bool) -> tuple[int, int, dict[str, Stored | None]]:
        """Write `plan` in the open transaction, settled against the pending Drain ranges
        (`_store_drain`); returns (rows written, change in `job_deltas` rows, what it
        learned of the rows)."""
        if self._tentative:
            expand_runs(plan)  # the pending ranges look at the plan's rows one by one
        self._settle_before(plan)
        written, known, delta_rows = write_plan(
            self._conn, plan, self._packer.pack, self._patch_floor, deltas,
            cold=_schema.cold_columns(self._version),
        )  # fmt: skip
        rows, ops = self._settle_after(plan, delta_rows)
        return written + rows, delta_rows - ops, known

    def load_jobs(
        self,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        queues: Collection[str] | None = None,
        completed_from: int | None = None,
        hot_only: bool = False,
    ) -> Iterator[Record]:
        """Yield the stored job records, in seq order (ties in insertion order).

        `queues`: only the jobs of these queues (None: every queue; past `MAX_FILTER_QUEUES`
        names the filter is not applied and the caller filters). `completed_from`: completed
        jobs only from this seq on (see `completed_floor`); other states are always loaded.
        `hot_only`: leave out the cold waiting and delayed jobs (`_cold`), which a shard under
        a memory budget pages in instead (a cold job in any other state is loaded).
        The filters run in SQLite, so a row they skip is never decoded.

        Rows are read `page_size` at a time, so memory stays bounded on a big database. Each
        page is its own read: apply no batch while iterating, or the pages may disagree.
        Raises `StorageError` (while iterating) if a read fails or a record cannot be decoded;
        `ValueError` if `page_size` < 1.
        """
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        where, params = _filter(queues)
        if completed_from is not None:
            where += " AND (state != 'completed' OR seq >= ?)"
            params = (*params, completed_from)
        with self._reading("reading the pending drains"):  # a hot row is in no Drain range
            floors = {} if hot_only else self._read_floors()
        if floors:
            yield from not_drained(self._load(where, params, page_size, hot_only), floors)
        else:
            yield from self._load(where, params, page_size, hot_only)

    def _load(
        self, where: str, params: tuple[Any, ...], page_size: int, hot_only: bool
    ) -> Iterator[Record]:
        if self._split_seq:
            yield from self._load_split(where, params, page_size, hot_only)
            return
        if hot_only and self._version >= _schema.COLD_VERSION:
            where += " AND " + HOT_SET
        first, more = _first_page(where), _next_page(where)
        with_ops = self._ids_with_deltas()
        rows = self._read_page(first, (*params, page_size))
        while rows:
            yield from self._decode_page(rows, with_ops)
            if len(rows) < page_size:
                return
            last_seq, last_rowid, _, _, _ = rows[-1]
            rows = self._read_page(more, (last_seq, last_rowid, *params, page_size))

    def _load_split(
        self, where: str, params: tuple[Any, ...], page_size: int, hot_only: bool
    ) -> Iterator[Record]:
        """`load_jobs` over the split seq indexes (`_seq_reads`): the hot set's two, or all."""
        if where == _NOTHING:  # no queue: SQLite finds no plan for a part that names its index
            return
        indexes = _seq.parts(hot_only)
        sql = _seq.page_sql(where, indexes)
        with_ops = self._ids_with_deltas()
        cursor = _seq.FIRST
        while True:
            rows = self._read_page(sql, _seq.page_params(cursor, params, page_size, indexes))
            yield from self._decode_page(rows, with_ops)
            if len(rows) < page_size:
                return
            cursor = (rows[-1][0], rows[-1][1])

    def _decode_page(self, rows: list[Any], with_ops: set[str]) -> Iterator[Record]:
        ops = self._page_deltas(rows, with_ops)
        for _s, _rowid, rec, patch, row_id in rows:
            yield self._decode_row(rec, patch, ops.get(row_id, ()))

    def queue_names(self) -> set[str]:
        """The name of every queue that has a stored job, config or configured group.

        Seeks the `queue` index once per queue (`_schema.QUEUE_NAMES_SQL`), never reads a row.
        Raises `StorageError` if the read fails.
        """
        with self._reading("listing queues"):
            names = {q for (q,) in self._conn.execute(_schema.QUEUE_NAMES_SQL)}
            names.update(n for (n,) in self._conn.execute("SELECT name FROM queue_state"))
            if self.schema_version >= GROUPS_VERSION:
                # A queue whose only trace is a configured group (its key's first column).
                sql = "SELECT DISTINCT queue FROM queue_groups"
                names.update(q for (q,) in self._conn.execute(sql))
            return names

    def get_job(self, job_id: str) -> Record | None:
        """The stored record of `job_id`, or None. Raises `StorageError` if the read fails."""
        with self._reading(f"reading job {job_id!r}"):
            # With the pending range of its queue, in the same statement (`BY_ID` says why).
            sql = BY_ID.format(m="?") if self._drain_table else _GET_JOB
            row = self._conn.execute(sql, (job_id,)).fetchone()
            if row is None or (self._drain_table and drained_row(*row[2:])):
                return None
            # Always looked up: a shard's reading store (the cold backlog's lookups) cannot
            # know what the writer appended since it opened (`_delta_rows` counts only its own).
            look = self._version >= _schema.DELTAS_VERSION
            ops = read_deltas(self._conn, (job_id,)).get(job_id, ()) if look else ()
            return self._decode_row(row[0], row[1], ops)

    def count_by_state(self, queue: str) -> dict[str, int]:
        """Stored jobs of `queue` per state (absent states are omitted).

        Raises `StorageError` if the read fails.
        """
        with self._reading(f"counting jobs of queue {queue!r}"):
            rows = self._conn.execute(
                "SELECT state, count(*) FROM jobs WHERE queue = ? GROUP BY state", (queue,)
            ).fetchall()
            return {state: int(n) for state, n in rows}

    def row_counts(self) -> dict[str, int]:
        """Rows of each table recovery reads, and jobs per state (`_counts.count_rows`):
        what `shardq storage copy` compares. Raises `StorageError` if a read fails."""
        with self._reading("counting rows"):
            sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
            present = {name for (name,) in self._conn.execute(sql)}
            return count_rows(lambda q: self._conn.execute(q).fetchall(), present,
                              drained="drain_pending" in present)  # fmt: skip

    def max_seq(self) -> int:
        """The highest seq of any stored job, 0 if there is none.

        A recovering engine continues its counter above it. Raises `StorageError` on failure.
        """
        with self._reading("reading the highest seq"):
            sql = _seq.max_seq_sql() if self._split_seq else "SELECT max(seq) FROM jobs"
            (seq,) = self._conn.execute(sql).fetchone()
            # A pending Drain range's bound too: a job pushed after it must stay above it.
            bounds = [r[1] for r in self._read_floors().values()]
            return max(0 if seq is None else int(seq), *bounds, 0)

    def release_memory(self) -> None:
        """Free this connection's page cache (`PRAGMA shrink_memory`; up to `cache_mb`) and
        the row summaries of the jobs written last (up to `cache_records`, about 250 bytes
        each): an update of one of them reads its row instead, once. A store from `open`
        then opens its connection again (`_reopen`). Call it only between transactions."""
        self._cache, self._unsettled = {}, None
        with self._reading("releasing memory"):
            self._conn.execute("PRAGMA shrink_memory")
            self._reopen()

    def close(self) -> None:
        """Close the connection (idempotent), then release the swap lock it kept (if any).
        Later calls raise `StorageError`."""
        try:
            self._conn.close()
        finally:
            if self._swap_lock is not None:
                os.close(self._swap_lock)
                self._swap_lock = None

    def keep_swap_lock(self, fd: int | None) -> None:
        """Release `fd` (`_rebuild.hold_shared`'s, taken before this store's connection
        opened) when the store closes: until then the writer cannot swap the file."""
        self._swap_lock = fd

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self._path)!r})"

    def _fetch_stored(self, job_ids: Collection[str]) -> Mapping[str, Stored]:
        """What is known of the stored rows of `job_ids` (`_coalesce.Fetch`): the cache itself
        when it knows them all (the usual case: the rows a batch updates were mostly written
        lately), so nothing is copied per job; else the cached ones and the rest read."""
        cache = self._cache
        for job_id in job_ids:
            if job_id not in cache:
                break
        else:
            return cache  # read only: `settle` replaces or changes it after the commit
        found: dict[str, Stored] = {}
        ids: list[str] = []
        for job_id in job_ids:
            info = cache.get(job_id)
            if info is None:
                ids.append(job_id)
            else:
                found[job_id] = info
        found.update(self._read_stored(ids, deltas=self._delta_rows > 0))
        return found

    def _read_stored(
        self, ids: Collection[str], *, deltas: bool | None = None
    ) -> dict[str, Stored]:
        """What the rows say of `ids`, not the cache (`deltas`: whether ops may exist; None:
        look, as a step of a batch after a `qdrain` must)."""
        found: dict[str, Stored] = {}
        with_ops = self._deltas_table if deltas is None else deltas
        for chunk in chunks(list(ids), FETCH_CHUNK):
            marks = ", ".join("?" * len(chunk))
            sql = f"SELECT id, queue, length(rec), length(patch) FROM jobs WHERE id IN ({marks})"
            sizes = delta_lengths(self._conn, chunk) if with_ops else {}
            for job_id, queue, rec_len, patch_len in self._conn.execute(sql, chunk):
                found[job_id] = (queue, rec_len, patch_len, sizes.get(job_id, 0))
        return found

    def _count_deltas(self) -> int:
        with self._reading("counting delta rows"):
            (n,) = self._conn.execute("SELECT count(*) FROM job_deltas").fetchone()
            return int(n)

    def _ids_with_deltas(self) -> set[str]:
        """The jobs that have ops in `job_deltas`: a few (folding keeps them few per job)."""
        if not self._delta_rows:
            return set()
        with self._reading("listing delta rows"):
            return {i for (i,) in self._conn.execute("SELECT DISTINCT id FROM job_deltas")}

    def _page_deltas(self, rows: list[Any], with_ops: set[str]) -> dict[str, list[bytes]]:
        if not with_ops:
            return {}
        wanted = [row[4] for row in rows if row[4] in with_ops]
        if not wanted:
            return {}
        with self._reading("loading delta rows"):
            return read_deltas(self._conn, wanted)

    _COLD_DIALECT = SQLITE

    def _cold_rows(self, action: str, sql: str, params: tuple[Any, ...]) -> list[Any]:
        with self._reading(action):
            return self._conn.execute(sql, params).fetchall()

    def _cold_ops(self, job_ids: list[str]) -> dict[str, list[bytes]]:
        with self._reading("loading delta rows"):
            return read_deltas(self._conn, job_ids)

    def _read_page(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        with self._reading("loading jobs"):
            return self._conn.execute(sql, params).fetchall()

    def _decode_row(self, rec: bytes, patch: bytes, ops: Iterable[bytes] = ()) -> Record:
        try:
            return merge_row(rec, patch, ops)
        except (ValueError, msgpack.UnpackException) as e:
            raise StorageError(f"{self._path}: a stored job record is corrupt: {e}") from e


_GET_JOB = "SELECT rec, patch FROM jobs WHERE id = ?"
"""A job's row by its key, on a schema without pending Drain ranges."""


def _first_page(where: str) -> str:
    return f"SELECT seq, rowid, rec, patch, id FROM jobs WHERE {where} ORDER BY seq, rowid LIMIT ?"


def _next_page(where: str) -> str:
    return (
        f"SELECT seq, rowid, rec, patch, id FROM jobs WHERE (seq, rowid) > (?, ?) AND {where}"
        " ORDER BY seq, rowid LIMIT ?"
    )


def _prepare_directory(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError as e:
        raise StorageError(
            f"cannot use {directory} as the database directory: it exists and is not a directory"
        ) from e
    except OSError as e:
        raise StorageError(f"cannot create the database directory {directory}: {e}") from e
    # SQLite creates the -wal and -shm files next to the database; without write access to
    # the directory, opening works and the first write fails with a far vaguer message.
    if not os.access(directory, os.W_OK | os.X_OK):
        raise StorageError(f"the database directory {directory} is not writable")


if TYPE_CHECKING:
    # mypy proves here that the SQLite store meets the contract the writer and recovery use.
    _satisfies_the_contract: type[Storage] = Store
