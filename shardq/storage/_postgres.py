"""`PostgresStore`: the storage contract (`Storage`) on a PostgreSQL server, via psycopg 3.

The same rows as the SQLite `Store` (its module says how a job is stored and why): a job row is
its encoded record plus the encoded changes since, its `delta` ops are rows of their own, and
the writer stores the bytes the shards encoded without decoding them. What differs:

- One `apply` is one transaction, its writes sent in one pipeline (`_pg_write`): a batch of
  any size costs about two round trips (the read of the rows it updates, then the writes and
  the commit) and one WAL flush: the group commit the writer makes anyway.
- Durability is the server's: a commit returns once PostgreSQL has it (`synchronous_commit`,
  replication and backups are its operator's settings). There is no size cap of shardq's
  own, and no log to checkpoint: `checkpoint` has nothing to do.
- A place is a database, and optionally a schema in it (`schema=`), created on first open:
  several shardq stores (or tests) can share one database.
- A lost connection (a server restart, a failover) is a transient `StorageError`; the next
  call connects again, so the writer's retry of the same batch goes through once the server
  is back.

psycopg is the optional extra `postgres` (`pip install 'shardq[postgres]'`); nothing imports
this module unless a PostgreSQL store is opened.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import psycopg
from psycopg import conninfo

from shardq.core._mutations import Mutation, Record
from shardq.storage import _pg_schema, _schema
from shardq.storage._coalesce import DrainInBatch, Plan, Stored, coalesce
from shardq.storage._cold_reads import HOT_SET, POSTGRES, ColdReads
from shardq.storage._contract import Storage
from shardq.storage._counts import count_rows
from shardq.storage._drain import DRAIN_CHUNK_ROWS, Done, apply_steps, remember_steps
from shardq.storage._drain_bounds import BY_ID, Range, drained_row
from shardq.storage._errors import StorageError
from shardq.storage._pg_drain import PgDrains
from shardq.storage._pg_fence import FENCE_SQL, Fence, check, plan_queues
from shardq.storage._pg_schema import Conn, pg_error
from shardq.storage._pg_write import Writes, read_deltas, write_plan
from shardq.storage._store_drain import not_drained
from shardq.storage._write import decode, merge_row

__all__ = ["PostgresStore"]

# The same bounds as the SQLite store's (shardq.storage._store), for the same reasons.
DEFAULT_PAGE_SIZE = 1000
DEFAULT_CACHE_RECORDS = 100_000
DEFAULT_PATCH_FLOOR = 1024
STALE_PAGE = 10_000
# Seconds to wait for the server when connecting, unless the URL says otherwise.
DEFAULT_CONNECT_TIMEOUT_S = 10


class PostgresStore(PgDrains, ColdReads):
    """The shardq tables in one PostgreSQL database (and schema), written in batches.

    Create one with `PostgresStore.open`. A store holds one connection and belongs to one
    thread; for writing, to one process: the writer. Use it as a context manager to close it.
    """

    def __init__(
        self,
        url: str,
        schema: str | None,
        conn: Conn,
        version: int,
        cache_records: int = DEFAULT_CACHE_RECORDS,
        patch_floor: int = DEFAULT_PATCH_FLOOR,
    ) -> None:
        """Use `PostgresStore.open`; this takes ownership of a migrated connection."""
        self._url = url
        self._schema = schema
        self._conn = conn
        self._version = version
        self._closed = False
        self._packer = msgpack.Packer(use_bin_type=True)
        self._skipped_updates = 0
        # What this store knows of the rows it wrote (as in the SQLite store), so the `upd`
        # of a job pushed a moment ago needs no read. Valid while this is the only writer.
        self._cache: dict[str, Stored] = {}
        self._cache_limit = cache_records
        self._unsettled: Done | None = None  # the last commit's, until `settle`
        self._patch_floor = patch_floor
        # Whether `job_deltas` may hold a row: while not, a put or delete needs no look there.
        self._deltas_exist = version >= _pg_schema.DELTAS_VERSION and self._any_deltas()
        self._counts_table = version >= _pg_schema.COUNTS_VERSION
        self._deltas_table = version >= _pg_schema.DELTAS_VERSION
        self.drain_chunk = DRAIN_CHUNK_ROWS
        """Rows per statement of a range deletion done in a batch (`_drain`, `_pg_drain`)."""
        self.fence: Fence | None = None
        """Set by a node among several (shardq.cluster): every batch then checks, in its own
        transaction, that this node still holds the partitions it writes."""
        self._open_drains()

    @classmethod
    def open(
        cls,
        url: str,
        *,
        schema: str | None = None,
        cache_records: int = DEFAULT_CACHE_RECORDS,
        patch_floor: int = DEFAULT_PATCH_FLOOR,
    ) -> PostgresStore:
        """Connect to the database at `url` (a libpq URL or conninfo string), create or
        migrate the shardq tables and return the store.

        `schema`: keep the tables in this schema (created if missing) rather than in the
        connection's search path. `cache_records` and `patch_floor` mean what they mean for
        the SQLite store (`Store.open`).

        Raises `StorageError` if the server cannot be reached or refuses the login, or the
        schema is newer than this code knows.
        """
        where = _describe(url, schema)
        conn = _connect(url, schema, where)
        try:
            version = _pg_schema.migrate(conn, schema)
            # Inside: making the store reads the pending Drain ranges (`_pg_drain`).
            return cls(url, schema, conn, version, cache_records, patch_floor)
        except Exception as e:
            conn.close()
            if isinstance(e, StorageError):
                raise type(e)(f"opening {where}: {e}") from e
            raise pg_error(e, f"opening {where}") from e

    @property
    def schema_version(self) -> int:
        """The schema version the tables are at (the number of migrations applied)."""
        return self._version

    @property
    def skipped_updates(self) -> int:
        """How many committed `upd` mutations found no job to update (since open)."""
        return self._skipped_updates

    def apply(self, mutations: Sequence[Mutation]) -> int:
        """Apply one batch of mutations (engine or encoded shapes) as one transaction; return
        the rows written. Means exactly what `Store.apply` means; raises `StorageRejected`
        when the batch's values are at fault, `StorageFull` when the server's disk is full
        and `StorageError` otherwise, and then nothing of the batch is stored."""
        if not mutations:
            return 0
        self.settle()
        conn = self._connection()
        try:
            with conn.transaction():
                self._begin_drains()
                try:
                    plan = coalesce(mutations, self._fetch_stored)
                except DrainInBatch:
                    written, delta_rows, done = apply_steps(mutations, self._segment, self._drain)
                else:
                    written, delta_rows, known = self._write(conn, plan, self._deltas_exist)
                    done = [(plan, known)]
        except Exception as e:
            # The commit's outcome may be unknown (a connection lost in COMMIT): forget what
            # the cache says, and read the rows again. The writer resends the same batch.
            self._cache = {}
            self._packer.reset()
            raise _as_storage_error(e, f"applying a batch of {len(mutations)} mutations") from e
        self._commit_drains()
        self._deltas_exist = self._deltas_exist or delta_rows > 0
        self._unsettled = done
        self._skipped_updates += sum(p.skipped for p, _ in done if isinstance(p, Plan))
        return written

    def settle(self) -> None:
        """As `Store.settle`: the cache learns the last commit's rows."""
        done, self._unsettled = self._unsettled, None
        if done is not None:
            self._cache = remember_steps(self._cache, self._cache_limit, done)

    def _write(self, conn: Conn, plan: Plan, deltas: bool) -> tuple[int, int, dict[str, Any]]:
        """Write `plan` in one pipeline, the fencing statement first (`_pg_fence`), settled
        against the pending Drain ranges (`_pg_drain`); returns (rows written, change in
        `job_deltas` rows, what it learned of the rows)."""
        self._settle_before(plan)
        writes = Writes(conn)
        fenced = self._fenced(plan) if self.fence is not None else None
        with conn.pipeline():
            if fenced is not None:
                # First in the pipeline: its locks precede every write of the batch.
                fence_rows = conn.cursor()
                fence_rows.execute(FENCE_SQL, fenced)  # no row counted
            known = write_plan(
                writes, plan, self._packer.pack, self._patch_floor, deltas,
                cold=_pg_schema.cold_columns(self._version),
                counted=self._version >= _pg_schema.COUNTED_VERSION,
            )  # fmt: skip
        if fenced is not None:
            # Synced, not committed: a partition lost rolls the whole batch back.
            check(fenced[2], fenced[0], fence_rows.fetchall())
        written, delta_rows = writes.totals()
        rows, ops = self._settle_after(plan)
        return written + rows, delta_rows - ops, known

    def _segment(self, mutations: Sequence[Mutation], first: bool) -> tuple[int, int, Plan, Any]:
        """One step of a batch holding a `qdrain` (`_drain.apply_steps`): a later one reads
        the rows as the steps before left them, not the cache."""
        plan = coalesce(mutations, self._fetch_stored if first else self._read_stored)
        written, delta_rows, known = self._write(
            self._conn, plan, self._deltas_exist or self._deltas_table
        )
        return written, delta_rows, plan, known

    def _fenced(self, plan: Plan) -> tuple[Any, ...]:
        """The fencing statement's parameters for `plan` (`shardq.storage._pg_fence`)."""
        fence = self.fence
        assert fence is not None
        queues = plan_queues(plan, self._cache, self._stored_queues)
        parts, epochs = fence.epochs_for(queues)
        return (parts, epochs, fence.node_id)

    def _stored_queues(self, job_ids: list[str]) -> dict[str, str]:
        sql = "SELECT id, queue FROM jobs WHERE id = ANY(%s::text[])"
        return dict(self._conn.execute(sql, (job_ids,)).fetchall())

    def load_jobs(
        self,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        queues: Collection[str] | None = None,
        completed_from: int | None = None,
        hot_only: bool = False,
    ) -> Iterator[Record]:
        """Yield the stored job records in seq order (ties in insertion order), `page_size`
        rows per query; the filters (`hot_only` too) mean what `Store.load_jobs`'s mean, and
        run in the server.
        Raises `StorageError` (while iterating) if a read fails; `ValueError` if
        `page_size` < 1."""
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        where, params = _filter(queues)
        if completed_from is not None:
            where += " AND (state <> 'completed' OR seq >= %s)"
            params = (*params, completed_from)
        floors = {} if hot_only else self._read_floors()  # a hot row is in no Drain range
        records = self._load(where, params, page_size, hot_only)
        yield from not_drained(records, floors) if floors else records

    def _load(
        self, where: str, params: tuple[Any, ...], page_size: int, hot_only: bool
    ) -> Iterator[Record]:
        if self._version >= _pg_schema.SEQ_VERSION:  # the split seq indexes (`_seq_reads`)
            conditions = _pg_schema.HOT_SEQ_CONDITIONS if hot_only else _ALL_SEQ
            first = more = _split_page(where, conditions)
            each = (len(conditions), params, page_size)
            rows = self._rows("loading jobs", first, _split_params(_FIRST, *each))
        else:
            if hot_only and self._version >= _pg_schema.COLD_VERSION:
                where += " AND " + HOT_SET
            columns = "SELECT seq, ord, rec, patch, id FROM jobs WHERE"
            first = f"{columns} {where} ORDER BY seq, ord LIMIT %s"
            more = f"{columns} (seq, ord) > (%s, %s) AND {where} ORDER BY seq, ord LIMIT %s"
            each = None
            rows = self._rows("loading jobs", first, (*params, page_size))
        while rows:
            ops = self._page_deltas([row[4] for row in rows])
            for _seq, _ord, rec, patch, row_id in rows:
                yield self._decode_row(rec, patch, ops.get(row_id, ()))
            if len(rows) < page_size:
                return
            last = (rows[-1][0], rows[-1][1])
            args = (*last, *params, page_size) if each is None else _split_params(last, *each)
            rows = self._rows("loading jobs", more, args)

    def queue_names(self) -> set[str]:
        """The name of every queue that has a stored job, config or configured group."""
        # The distinct queues of `jobs` by one seek of its `queue` index each.
        sql = f"{_schema.QUEUE_NAMES_SQL} UNION SELECT name FROM queue_state"
        if self._version >= _pg_schema.GROUPS_VERSION:
            sql += " UNION SELECT DISTINCT queue FROM queue_groups"
        return {name for (name,) in self._rows("listing queues", sql, ())}

    def max_seq(self) -> int:
        """The highest seq of any stored job, 0 if there is none."""
        sql = "SELECT max(seq) FROM jobs"
        if self._version >= _pg_schema.SEQ_VERSION:  # the last entry of each seq index
            one = "(SELECT seq FROM jobs WHERE {} ORDER BY seq DESC LIMIT 1)"
            sql = "SELECT greatest(" + ", ".join(one.format(c) for c in _ALL_SEQ) + ")"
        (seq,) = self._rows("reading the highest seq", sql, ())[0]
        # A pending Drain range's bound too: a job pushed after it must stay above it.
        bounds = [r[1] for r in self._read_floors().values()]
        return max(0 if seq is None else int(seq), *bounds, 0)

    def _read_floors(self) -> dict[str, Range]:
        """Every pending Drain range, as the table holds it (any node's)."""
        if not self._drain_table:
            return {}
        sql = "SELECT queue, above, seq FROM drain_pending"
        rows = self._rows("reading the pending drains", sql, ())
        return {q: (None if a is None else int(a), int(s)) for q, a, s in rows}

    def completed_floor(self, keep: int, queues: Collection[str] | None = None) -> int | None:
        """The seq from which the newest `keep` completed jobs (of `queues`) are stored, or
        None if there are at most `keep`. Raises `ValueError` if `keep` < 1."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        where, params = _filter(queues)
        if self._version >= _pg_schema.SEQ_VERSION:  # the hot set's seq indexes only
            one = (
                "(SELECT seq FROM jobs WHERE {c} AND state = 'completed' AND {w}"
                " ORDER BY seq DESC LIMIT %s)"
            )
            hot = _pg_schema.HOT_SEQ_CONDITIONS
            sql = " UNION ALL ".join(one.format(c=c, w=where) for c in hot)
            sql += " ORDER BY 1 DESC LIMIT 1 OFFSET %s"
            params = (*params, keep + 1) * len(hot)
        else:
            sql = (
                f"SELECT seq FROM jobs WHERE state = 'completed' AND {where}"
                " ORDER BY seq DESC LIMIT 1 OFFSET %s"
            )
        rows = self._rows("finding the retained completed jobs", sql, (*params, keep))
        # Row `keep` (0-based) is the newest one past the window: the window starts above it.
        return int(rows[0][0]) + 1 if rows else None

    def stale_completed(
        self, below: int, queues: Collection[str] | None = None
    ) -> Iterator[list[str]]:
        """Row keys of completed jobs (of `queues`) with a seq below `below`, in lists of at
        most `STALE_PAGE`, paged along the primary key. Raises `StorageError` if a read
        fails."""
        where, params = _filter(queues)
        sql = f"SELECT id FROM jobs WHERE state = 'completed' AND seq < %s AND {where}"
        first, more = f"{sql} ORDER BY id LIMIT %s", f"{sql} AND id > %s ORDER BY id LIMIT %s"
        action = "listing stale completed jobs"
        rows = self._rows(action, first, (below, *params, STALE_PAGE))
        while rows:
            yield [key for (key,) in rows]
            if len(rows) < STALE_PAGE:
                return
            rows = self._rows(action, more, (below, *params, rows[-1][0], STALE_PAGE))

    def load_queues(self) -> dict[str, Record]:
        """Every stored queue config by name, its groups' settings as a "groups" map."""
        rows = self._rows("loading queue configs", "SELECT name, cfg FROM queue_state", ())
        queues: dict[str, Record] = {name: self._decode(cfg) for name, cfg in rows}
        if self._version < _pg_schema.GROUPS_VERSION:
            return queues
        sql = "SELECT queue, gid, cfg FROM queue_groups ORDER BY queue, gid"
        for queue, gid, cfg in self._rows("loading job groups", sql, ()):
            queues.setdefault(queue, {}).setdefault("groups", {})[gid] = self._decode(cfg)
        return queues

    def load_crons(self) -> list[Record]:
        """Every stored cron schedule record, by name."""
        sql = "SELECT rec FROM cron_jobs ORDER BY name"
        return [self._decode(rec) for (rec,) in self._rows("loading cron schedules", sql, ())]

    def load_webhooks(self) -> list[Record]:
        """Every stored webhook record, by id."""
        sql = "SELECT rec FROM webhooks ORDER BY id"
        return [self._decode(rec) for (rec,) in self._rows("loading webhooks", sql, ())]

    def load_flow_outbox(self) -> list[Record]:
        """Every flow notice not acknowledged yet, by key."""
        sql = "SELECT rec FROM flow_outbox ORDER BY key"
        return [self._decode(rec) for (rec,) in self._rows("loading the flow outbox", sql, ())]

    def get_job(self, job_id: str) -> Record | None:
        """The stored record under row key `job_id`, or None."""
        # With the pending range of its queue, in the same statement (`BY_ID` says why).
        sql = BY_ID.format(m="%s") if self._drain_table else _GET_JOB
        rows = self._rows(f"reading job {job_id!r}", sql, (job_id,))
        if not rows or (self._drain_table and drained_row(*rows[0][2:])):
            return None
        ops = self._page_deltas([job_id]).get(job_id, ())
        return self._decode_row(rows[0][0], rows[0][1], ops)

    def row_counts(self) -> dict[str, int]:
        """Rows of each table recovery reads, and jobs per state (`_counts.count_rows`):
        what `shardq storage copy` compares. Raises `StorageError` if a read fails."""
        return count_rows(
            lambda sql: self._rows("counting rows", sql, ()), drained=self._drain_table
        )

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Nothing to fold: PostgreSQL manages its own log. True."""
        self._connection()  # a closed store still raises, as the contract says
        return True

    def database_bytes(self) -> int:
        """`pg_database_size` of the connected database. Raises `StorageError`."""
        sql = "SELECT pg_database_size(current_database())"
        return int(self._rows("reading the database size", sql, ())[0][0])

    def free_pages(self) -> int:
        """0: PostgreSQL's autovacuum gives dead rows' space back by itself."""
        self._connection()
        return 0

    def release_pages(self, pages: int) -> int:
        """Nothing to release (see `free_pages`): 0."""
        self._connection()
        return 0

    def set_progress(self, beat: Callable[[], None] | None) -> None:
        """Does nothing: a statement runs in the server while the client waits in libpq, and
        psycopg has no hook that calls back meanwhile (a second thread could beat, but the
        shard's link to the supervisor belongs to its main thread). A starting shard still
        beats between statements."""
        del beat

    def new_connection(self) -> Conn:
        """Another autocommit connection to the same database and schema, for a thread of its
        own (the lease keeper). Raises `StorageError` if it cannot connect."""
        return _connect(self._url, self._schema, _describe(self._url, self._schema))

    def release_memory(self) -> None:
        """The row summaries of the jobs written last (`cache_records`): an update of one of
        them reads its row instead, once. PostgreSQL's own caches live in its server."""
        self._cache, self._unsettled = {}, None

    def close(self) -> None:
        """Close the connection (idempotent). Later calls raise `StorageError`."""
        self._closed = True
        self._conn.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresStore({_describe(self._url, self._schema)!r})"

    def _connection(self) -> Conn:
        """The open connection; a new one if the last was lost (the server restarted)."""
        if self._closed:
            raise StorageError(f"{self!r} is closed")
        if self._conn.broken or self._conn.closed:
            self._conn = _connect(self._url, self._schema, _describe(self._url, self._schema))
        return self._conn

    def _fetch_stored(self, job_ids: Collection[str]) -> dict[str, Stored]:
        found: dict[str, Stored] = {}
        cache = self._cache
        ids: list[str] = []
        for job_id in job_ids:
            info = cache.get(job_id)
            if info is None:
                ids.append(job_id)
            else:
                found[job_id] = info
        if ids:
            found.update(self._read_stored(ids, deltas=self._deltas_exist))
        return found

    def _read_stored(
        self, job_ids: Collection[str], *, deltas: bool | None = None
    ) -> dict[str, Stored]:
        """What the rows say of `job_ids`, not the cache (`deltas`: whether ops may exist;
        None: look, as a step of a batch after a `qdrain` must)."""
        ids = list(job_ids)
        found: dict[str, Stored] = {}
        sizes: dict[str, int] = {}
        if self._deltas_table if deltas is None else deltas:
            sql = (
                "SELECT id, sum(octet_length(d)) FROM job_deltas WHERE id = ANY(%s::text[])"
                " GROUP BY id"
            )
            sizes = {i: int(n) for i, n in self._conn.execute(sql, (ids,)).fetchall()}
        sql = (
            "SELECT id, queue, octet_length(rec), octet_length(patch) FROM jobs"
            " WHERE id = ANY(%s::text[])"
        )
        for job_id, queue, rec_len, patch_len in self._conn.execute(sql, (ids,)).fetchall():
            found[job_id] = (queue, rec_len, patch_len, sizes.get(job_id, 0))
        return found

    def _any_deltas(self) -> bool:
        return bool(self._rows("counting delta rows", "SELECT 1 FROM job_deltas LIMIT 1", ()))

    def _page_deltas(self, job_ids: list[str]) -> dict[str, list[bytes]]:
        if not self._deltas_exist or not job_ids:
            return {}
        try:
            return read_deltas(self._connection(), job_ids)
        except Exception as e:
            raise _as_storage_error(e, "loading delta rows") from e

    _COLD_DIALECT = POSTGRES

    def _cold_rows(self, action: str, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return self._rows(action, sql, params)

    def _cold_ops(self, job_ids: list[str]) -> dict[str, list[bytes]]:
        try:
            return read_deltas(self._connection(), job_ids)
        except Exception as e:
            raise _as_storage_error(e, "loading delta rows") from e

    def _rows(self, action: str, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """All rows of one read (autocommit: its own snapshot), as binary values."""
        try:
            return self._connection().execute(sql, params, binary=True).fetchall()
        except Exception as e:
            raise _as_storage_error(e, f"{self!r}: {action}") from e

    def _decode(self, blob: bytes) -> Any:
        try:
            return decode(blob)
        except (ValueError, msgpack.UnpackException) as e:
            raise StorageError(f"{self!r}: a stored record is corrupt: {e}") from e

    def _decode_row(self, rec: bytes, patch: bytes, ops: Iterable[bytes] = ()) -> Record:
        try:
            return merge_row(rec, patch, ops)
        except (ValueError, msgpack.UnpackException) as e:
            raise StorageError(f"{self!r}: a stored job record is corrupt: {e}") from e


_GET_JOB = "SELECT rec, patch FROM jobs WHERE id = %s"
"""A job's row by its key, on a schema without pending Drain ranges."""
_FIRST = (-(1 << 63), -(1 << 63))
"""The (seq, ord) cursor before every row."""
_ALL_SEQ = tuple(_pg_schema.SEQ_INDEXES.values())


def _split_page(where: str, conditions: Sequence[str]) -> str:
    """A page in (seq, ord) order over the seq indexes of `conditions` (SQLite's
    `_seq_reads.page_sql`): each part repeats its index's condition and reads at most the
    page's rows from it in order; the few rows they return are merged."""
    one = (
        "(SELECT seq, ord, rec, patch, id FROM jobs WHERE {c} AND (seq, ord) > (%s, %s)"
        " AND {w} ORDER BY seq, ord LIMIT %s)"
    )
    union = " UNION ALL ".join(one.format(c=c, w=where) for c in conditions)
    return f"{union} ORDER BY 1, 2 LIMIT %s"


def _split_params(
    cursor: tuple[int, int], parts: int, params: tuple[Any, ...], limit: int
) -> tuple[Any, ...]:
    return (*(*cursor, *params, limit) * parts, limit)


def _as_storage_error(exc: Exception, action: str) -> StorageError:
    return exc if isinstance(exc, StorageError) else pg_error(exc, action)


def _connect(url: str, schema: str | None, where: str) -> Conn:
    """An autocommit connection whose search path starts at `schema` (if given)."""
    kwargs: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in url:
        kwargs["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT_S
    if schema is not None:
        # The schema is created by the migration; a search path may name one that is not yet.
        kwargs["options"] = f"-c search_path={_quote_ident(schema)}"
    try:
        return psycopg.connect(url, **kwargs)
    except psycopg.Error as e:
        raise StorageError(f"opening {where}: cannot connect: {e}") from e


def _quote_ident(name: str) -> str:
    # libpq's `options` value goes to the server as one setting: quote the schema name as an
    # SQL identifier, and escape the spaces and backslashes the options string would split on.
    quoted = '"' + name.replace('"', '""') + '"'
    return quoted.replace("\\", "\\\\").replace(" ", "\\ ")


def _describe(url: str, schema: str | None) -> str:
    """The place without its password, for messages."""
    try:
        info = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "a PostgreSQL database (unparsable URL)"
    host, port, db = info.get("host", ""), info.get("port", ""), info.get("dbname", "")
    place = f"postgresql://{host}{':' if port else ''}{port}/{db}"
    return f"{place} schema {schema}" if schema is not None else place


def _filter(queues: Collection[str] | None) -> tuple[str, tuple[Any, ...]]:
    """A WHERE condition (and its parameter) keeping the jobs of `queues`: one array, however
    long (the server hashes a long one)."""
    if queues is None:
        return "TRUE", ()
    return "queue = ANY(%s::text[])", (sorted(queues),)


if TYPE_CHECKING:
    # mypy proves here that the PostgreSQL store meets the contract, as the SQLite one does.
    _satisfies_the_contract: type[Storage] = PostgresStore
