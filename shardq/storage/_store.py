"""`Store`: the SQLite file the writer owns, and the recovery reads."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
from sqlite_utils import Database

from shardq.core._mutations import Mutation, Record
from shardq.storage import _schema
from shardq.storage._coalesce import Plan, coalesce, row_fields
from shardq.storage._errors import StorageError, wrap_error
from shardq.storage._tx import transaction

__all__ = ["Store"]

# Recovery holds one page of decoded records at a time; 1000 keeps that to a few MB.
DEFAULT_PAGE_SIZE = 1000
# Recently written records kept to merge updates into: a job is usually pulled and acked soon
# after it is pushed. About 1-2 KB each, so the default holds 20-40 MB at most.
DEFAULT_CACHE_RECORDS = 20_000
# Stays under SQLite's historical 999 bound parameters per statement.
_FETCH_CHUNK = 500

_UPSERT_JOB = (
    "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec) VALUES (?, ?, ?, ?, ?, ?, ?)"
    # An in-place update, unlike INSERT OR REPLACE, rewrites only the indexes whose columns
    # changed, and keeps the rowid (and so the tie order among equal seqs) stable.
    " ON CONFLICT (id) DO UPDATE SET queue = excluded.queue, state = excluded.state,"
    " priority = excluded.priority, run_at = excluded.run_at, seq = excluded.seq,"
    " rec = excluded.rec"
)
_DELETE_JOB = "DELETE FROM jobs WHERE id = ?"
_DELETE_QUEUE_JOBS = "DELETE FROM jobs WHERE queue = ?"
_UPSERT_QUEUE = (
    "INSERT INTO queue_state (name, cfg) VALUES (?, ?)"
    " ON CONFLICT (name) DO UPDATE SET cfg = excluded.cfg"
)
_DELETE_QUEUE = "DELETE FROM queue_state WHERE name = ?"
_FIRST_PAGE = "SELECT seq, rowid, rec FROM jobs ORDER BY seq, rowid LIMIT ?"
_NEXT_PAGE = (
    "SELECT seq, rowid, rec FROM jobs WHERE (seq, rowid) > (?, ?) ORDER BY seq, rowid LIMIT ?"
)


def _decode(blob: bytes) -> Any:
    # strict_map_key=False: a job payload may legitimately use integer map keys, and a record
    # we stored must always load back, or recovery would stop at it.
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)


class Store:
    """The shardq database: jobs and queue configs, written in batches of mutations.

    Create one with `Store.open`. A `Store` belongs to one thread (sqlite3's default check)
    and, for writing, to one process: the writer. Use it as a context manager to close it.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        db: Database,
        path: Path,
        version: int,
        cache_records: int = DEFAULT_CACHE_RECORDS,
    ) -> None:
        """Use `Store.open`; this only takes ownership of an already configured connection."""
        self._conn = conn
        self._db = db
        self._path = path
        self._version = version
        self._packer = msgpack.Packer(use_bin_type=True)
        self._skipped_updates = 0
        # Records this store wrote last, so the `upd` of a job pushed a moment ago merges into
        # memory instead of reading and decoding its row back. Valid because this connection
        # is the only writer; updated only after a commit succeeded.
        self._cache: OrderedDict[str, Record] = OrderedDict()
        self._cache_limit = cache_records

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "normal",
        max_bytes: int | None = None,
        cache_records: int = DEFAULT_CACHE_RECORDS,
    ) -> Store:
        """Open (creating it if needed) the database at `path` and migrate it.

        `synchronous` is "normal" (survives any process crash) or "full" (also survives power
        loss, at about 4x the cost of a small commit). `max_bytes` caps the file size: writes
        beyond it fail with `StorageFull` (None = no cap, the disk is the limit).
        `cache_records` bounds the records kept in memory to merge updates into (0 = none).

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
        try:
            _schema.configure(conn, synchronous=synchronous, max_bytes=max_bytes)
            db = Database(conn, recursive_triggers=False, execute_plugins=False)
            version = _schema.migrate(conn, db)
        except Exception as e:
            conn.close()
            if isinstance(e, StorageError):
                raise type(e)(f"opening {path}: {e}") from e
            raise wrap_error(e, f"opening {path}") from e
        return cls(conn, db, path, version, cache_records)

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

        The batch is first coalesced (see `shardq.storage._coalesce`): a job put and updated
        in the same batch is written once. The result equals applying the mutations one by one.
        Rows written counts inserted, updated and deleted rows of both tables; an `upd` of a
        job that does not exist is skipped and counted in `skipped_updates`.

        Raises `StorageFull` if the disk (or `max_bytes`) is full, and `StorageError` for a
        malformed mutation, a record msgpack cannot encode, or any other SQLite failure. In
        every case the database is left exactly as it was before the call.
        """
        if not mutations:
            return 0
        with transaction(self._conn, f"applying a batch of {len(mutations)} mutations"):
            plan = coalesce(mutations, self._fetch_records)
            written = self._write(plan)
        self._remember(plan)
        self._skipped_updates += plan.skipped
        return written

    def load_jobs(self, *, page_size: int = DEFAULT_PAGE_SIZE) -> Iterator[Record]:
        """Yield every stored job record, in seq order (ties in insertion order).

        Rows are read `page_size` at a time, so memory stays bounded on a big database. Each
        page is its own read: apply no batch while iterating, or the pages may disagree.
        Raises `StorageError` (while iterating) if a read fails or a record cannot be decoded;
        `ValueError` if `page_size` < 1.
        """
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        rows = self._read_page(_FIRST_PAGE, (page_size,))
        while rows:
            for _seq, _rowid, blob in rows:
                yield self._decode_row(blob)
            if len(rows) < page_size:
                return
            last_seq, last_rowid, _ = rows[-1]
            rows = self._read_page(_NEXT_PAGE, (last_seq, last_rowid, page_size))

    def load_queues(self) -> dict[str, Record]:
        """Every stored queue config, by queue name. Raises `StorageError` if the read fails."""
        with self._reading("loading queue configs"):
            rows = self._conn.execute("SELECT name, cfg FROM queue_state").fetchall()
            return {name: _decode(cfg) for name, cfg in rows}

    def get_job(self, job_id: str) -> Record | None:
        """The stored record of `job_id`, or None. Raises `StorageError` if the read fails."""
        with self._reading(f"reading job {job_id!r}"):
            row = self._conn.execute("SELECT rec FROM jobs WHERE id = ?", (job_id,)).fetchone()
            return None if row is None else self._decode_row(row[0])

    def count_by_state(self, queue: str) -> dict[str, int]:
        """Stored jobs of `queue` per state (absent states are omitted).

        Raises `StorageError` if the read fails.
        """
        with self._reading(f"counting jobs of queue {queue!r}"):
            rows = self._conn.execute(
                "SELECT state, count(*) FROM jobs WHERE queue = ? GROUP BY state", (queue,)
            ).fetchall()
            return {state: int(n) for state, n in rows}

    def max_seq(self) -> int:
        """The highest seq of any stored job, 0 if there is none.

        A recovering engine continues its counter above it. Raises `StorageError` on failure.
        """
        with self._reading("reading the highest seq"):
            (seq,) = self._conn.execute("SELECT max(seq) FROM jobs").fetchone()
            return 0 if seq is None else int(seq)

    def checkpoint(self) -> bool:
        """Copy the WAL into the database file and truncate it; True if it completed.

        False means a reader still needed old pages; the WAL is then only partly copied and a
        later checkpoint finishes the job. Raises `StorageError` if SQLite fails.
        """
        with self._reading("checkpointing the WAL"):
            busy, _log, _done = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return int(busy) == 0

    def pragmas(self) -> dict[str, object]:
        """The connection's settings as SQLite reports them (journal_mode, synchronous ...).

        Raises `StorageError` if the read fails.
        """
        with self._reading("reading pragmas"):
            return _schema.read_pragmas(self._conn)

    def describe(self) -> _schema.SchemaInfo:
        """The schema as stored: version, applied migrations, columns, indexes.

        Raises `StorageError` if the read fails.
        """
        return _schema.describe(self._db)

    def close(self) -> None:
        """Close the connection (idempotent). Later calls raise `StorageError`."""
        self._conn.close()

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

    def _remember(self, plan: Plan) -> None:
        cache = self._cache
        if plan.obliterated:
            gone = [i for i, rec in cache.items() if rec.get("queue") in plan.obliterated]
            for job_id in gone:
                del cache[job_id]
        for job_id, rec in plan.jobs.items():
            if rec is None:
                cache.pop(job_id, None)
            elif self._cache_limit:
                cache[job_id] = rec
                cache.move_to_end(job_id)
        while len(cache) > self._cache_limit:
            cache.popitem(last=False)

    def _fetch_records(self, job_ids: Collection[str]) -> dict[str, Record]:
        found: dict[str, Record] = {}
        ids: list[str] = []
        for job_id in job_ids:
            cached = self._cache.get(job_id)
            if cached is None:
                ids.append(job_id)
            else:
                # Shared, not copied: the coalescer copies a fetched record on its first change,
                # so a failed batch leaves the cache as it was.
                found[job_id] = cached
        for start in range(0, len(ids), _FETCH_CHUNK):
            chunk = ids[start : start + _FETCH_CHUNK]
            marks = ", ".join("?" * len(chunk))
            sql = f"SELECT id, rec FROM jobs WHERE id IN ({marks})"
            for job_id, blob in self._conn.execute(sql, chunk):
                found[job_id] = _decode(blob)
        return found

    def _write(self, plan: Plan) -> int:
        conn = self._conn
        written = 0
        if plan.obliterated:
            # Before the job rows: a put later in the batch for that queue must survive it.
            queues = [(name,) for name in plan.obliterated]
            written += conn.executemany(_DELETE_QUEUE_JOBS, queues).rowcount
        deleted = [(job_id,) for job_id, rec in plan.jobs.items() if rec is None]
        if deleted:
            written += conn.executemany(_DELETE_JOB, deleted).rowcount
        rows = [self._job_row(job_id, rec) for job_id, rec in plan.jobs.items() if rec is not None]
        if rows:
            written += conn.executemany(_UPSERT_JOB, rows).rowcount
        pack = self._packer.pack
        configs = [(name, pack(cfg)) for name, cfg in plan.queues.items() if cfg is not None]
        if configs:
            written += conn.executemany(_UPSERT_QUEUE, configs).rowcount
        dropped = [(name,) for name, cfg in plan.queues.items() if cfg is None]
        if dropped:
            written += conn.executemany(_DELETE_QUEUE, dropped).rowcount
        return written

    def _job_row(self, job_id: str, rec: Record) -> tuple[Any, ...]:
        queue, state, priority, run_at, seq = row_fields(job_id, rec)
        return (job_id, queue, state, priority, run_at, seq, self._packer.pack(rec))

    def _read_page(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        with self._reading("loading jobs"):
            return self._conn.execute(sql, params).fetchall()

    def _decode_row(self, blob: bytes) -> Record:
        try:
            rec = _decode(blob)
        except (ValueError, msgpack.UnpackException) as e:
            raise StorageError(f"{self._path}: a stored job record is corrupt: {e}") from e
        if not isinstance(rec, dict):
            raise StorageError(f"{self._path}: a stored job record is not a map: {rec!r:.100}")
        return rec

    @contextlib.contextmanager
    def _reading(self, action: str) -> Iterator[None]:
        # Reads run in autocommit mode and need no transaction; only the error mapping is
        # shared with writes. ValueError covers a corrupt msgpack blob.
        try:
            yield
        except StorageError:
            raise
        except (sqlite3.Error, ValueError) as e:
            raise wrap_error(e, f"{self._path}: {action}") from e


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
