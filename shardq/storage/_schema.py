"""Connection settings, the schema and its forward migrations: all in this one module.

Migrations are an ordered list of functions. Migration `MIGRATIONS[i]` takes a database at
version `i` to version `i + 1`, and the `migrations` table records every version applied. Each
migration runs in its own transaction together with its record, so a crash mid-migration leaves
the previous version intact. Never edit a released migration; append a new one.

A new file (no table at all) gets the newest schema in one transaction from the script in
`_schema_fresh.py`, made from a migrated file; after appending a migration, make that script
again (`tests/storage/test_fresh_schema.py` prints it), or new files migrate step by step.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.storage import _cold_count_table
from shardq.storage import _schema_fresh as fresh
from shardq.storage._cold import cold_state
from shardq.storage._cold_reads import (
    COLD_BACKLOG,
    SQLITE,
    count_over_indexes_sql,
    over_indexes_counts,
)
from shardq.storage._errors import StorageError, wrap_error
from shardq.storage._modes import SYNCHRONOUS_MODES
from shardq.storage._progress import migration_progress, migration_step, schema_creation
from shardq.storage._tx import transaction

if TYPE_CHECKING:
    # Imported where used (`database`): only a migration or `describe` needs sqlite-utils,
    # and it costs a server process ~10 MB and its start ~60 ms (click, pluggy, plugins).
    from sqlite_utils import Database

__all__ = [
    "COLD_BACKLOG",
    "MADE_INDEXES",
    "MADE_VERSION",
    "MIGRATIONS",
    "SYNCHRONOUS_MODES",
    "SchemaInfo",
    "backfill_made",
    "cold_columns",
    "configure",
    "database",
    "describe",
    "migrate",
    "read_pragmas",
]


PAGE_SIZE = 4096  # bunqueue's value; also the page size of the usual filesystems.

# Order matters: busy_timeout comes first so every later statement waits on a lock instead of
# failing; page_size must precede journal_mode, as a WAL database can no longer change it.
_PRAGMAS_BEFORE_WAL: tuple[tuple[str, object], ...] = (
    ("busy_timeout", 5000),  # ms; bunqueue's value: outwait a checkpoint or a backup reader
    ("page_size", PAGE_SIZE),  # only takes effect on a new, empty database
    # So does this: a database created with it can give its free pages back to the file
    # system a few at a time (`_vacuum`); an older one needs one full VACUUM (`_vacuum.convert`).
    ("auto_vacuum", "INCREMENTAL"),
)
_PRAGMAS_AFTER_WAL: tuple[tuple[str, object], ...] = (
    ("temp_store", "MEMORY"),
    ("foreign_keys", "OFF"),  # no foreign keys in this schema; keep every write check-free
)
# The page cache and the memory map both count in the resident memory of the process that
# holds the connection, the writer above all (bunqueue's 64 MB and 256 MiB made the writer
# about 400 MB after a 1,000,000-job drain). shardq's writes append in id order and its reads
# are few, so a small cache and no map cost nothing measurable (BENCHMARKS.md section 5).
DEFAULT_CACHE_MB = 16
DEFAULT_MMAP_MB = 0

# What `read_pragmas` reports, for tests and operators.
_REPORTED_PRAGMAS = (
    "journal_mode",
    "synchronous",
    "busy_timeout",
    "page_size",
    "auto_vacuum",
    "cache_size",
    "temp_store",
    "mmap_size",
    "foreign_keys",
    "max_page_count",
)


def configure(
    conn: sqlite3.Connection,
    *,
    synchronous: str,
    max_bytes: int | None,
    cache_mb: int = DEFAULT_CACHE_MB,
    mmap_mb: int = DEFAULT_MMAP_MB,
) -> None:
    """Apply every PRAGMA shardq relies on. This is the only place a PRAGMA is set, but for
    the few that `_vacuum` and `Store.checkpoint` set around one operation and restore.

    `cache_mb` is SQLite's page cache and `mmap_mb` its memory-mapped read window (0 = plain
    reads), both per connection.

    `max_bytes` caps the database file size (None = no cap); writes past it fail with
    `StorageFull`, which is how disk-full handling is exercised without filling a disk.

    Raises `StorageError` for an unknown `synchronous` value, a file that is not a SQLite
    database, or a filesystem on which WAL mode cannot be enabled.
    """
    mode = synchronous_mode(synchronous)
    for name, value in _PRAGMAS_BEFORE_WAL:
        conn.execute(f"PRAGMA {name} = {value}")
    (journal,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if str(journal).lower() != "wal":
        # WAL is what makes group commit cheap and lets readers run beside the writer; a
        # silent fallback to a rollback journal would change both.
        raise StorageError(f"cannot enable WAL journal mode (SQLite kept {journal!r})")
    conn.execute(f"PRAGMA synchronous = {mode}")
    for name, value in _PRAGMAS_AFTER_WAL:
        conn.execute(f"PRAGMA {name} = {value}")
    conn.execute(f"PRAGMA cache_size = {-1024 * int(cache_mb)}")  # negative means KiB
    conn.execute(f"PRAGMA mmap_size = {(int(mmap_mb) << 20)}")
    if max_bytes is not None:
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        conn.execute(f"PRAGMA max_page_count = {max(1, int(max_bytes) // int(page_size))}")


def synchronous_mode(synchronous: str) -> str:
    """The PRAGMA value for a `synchronous` setting. Raises `StorageError` if unknown."""
    try:
        return SYNCHRONOUS_MODES[synchronous.lower()]
    except (KeyError, AttributeError):
        known = ", ".join(repr(k) for k in SYNCHRONOUS_MODES)
        raise StorageError(f"unknown synchronous mode {synchronous!r} (use {known})") from None


def read_pragmas(conn: sqlite3.Connection) -> dict[str, object]:
    """The current value of every PRAGMA `configure` manages, as SQLite reports it."""
    return {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in _REPORTED_PRAGMAS}


def _v1_initial(db: Database) -> None:
    jobs = db.table("jobs")
    jobs.create(
        {
            "id": str,
            "queue": str,
            "state": str,
            "priority": float,
            "run_at": int,
            "seq": int,
            "rec": bytes,  # the whole msgpack-encoded job record; the columns are for queries
        },
        pk="id",
        not_null={"queue", "state", "seq", "rec"},
    )
    jobs.create_index(["queue", "state", "seq"], index_name="idx_jobs_queue_state_seq")
    jobs.create_index(["state"], index_name="idx_jobs_state")
    # Recovery streams every job in seq order; without this index each page would sort the
    # whole table. Its entries are (seq, rowid), so keyset pages on (seq, rowid) are range scans.
    jobs.create_index(["seq"], index_name="idx_jobs_seq")
    db.table("queue_state").create({"name": str, "cfg": bytes}, pk="name", not_null={"cfg"})
    db.table("meta").create({"key": str, "value": str}, pk="key")
    db.table("meta").insert({"key": "record_encoding", "value": "msgpack"})


def _v2_patch(db: Database) -> None:
    # A job row becomes `rec` plus `patch`: the changes since `rec` was written, as msgpack
    # change maps one after the other, each after its length (shardq.storage._store). ADD
    # COLUMN with a constant default rewrites nothing: the rows stored before read an empty
    # patch, so they load as they are.
    db.execute("ALTER TABLE jobs ADD COLUMN patch BLOB NOT NULL DEFAULT x''")
    value = "repeated: u32 big-endian length, then a msgpack map"
    db.table("meta").insert({"key": "patch_encoding", "value": value})


def _v3_narrow_indexes(db: Database) -> None:
    # No query of the server reads `state`, and only obliterate's `DELETE ... WHERE queue = ?`
    # read `(queue, state, seq)`, for its first column: recovery pages through `seq` and
    # everything else finds a row by `id`. Yet every change of a job's state rewrote an entry
    # in both: bench.writer's push->pull->ack went from 23.6 to 19.0 us per job without them
    # (18.3 without the `queue` index below, whose entry a put adds). Obliterate keeps an index
    # on `queue` alone: a job's queue never changes, so only a put or a delete touches it, and
    # an obliterate reads its own queue's rows rather than the whole table, which on a large
    # database would hold up every commit (and durable push) behind it.
    db.execute("DROP INDEX IF EXISTS idx_jobs_state")
    db.execute("DROP INDEX IF EXISTS idx_jobs_queue_state_seq")
    db.execute("CREATE INDEX IF NOT EXISTS idx_jobs_queue ON jobs (queue)")


def _v4_cron_jobs(db: Database) -> None:
    # Cron schedules (shardq.core._cron), one row per schedule name, the whole record in `rec`;
    # `queue` lets a shard load only the schedules of the queues it owns. A table of its own
    # keeps the jobs table, and so the writer's per-job statements, exactly as they were.
    db.table("cron_jobs").create(
        {"name": str, "queue": str, "rec": bytes}, pk="name", not_null={"queue", "rec"}
    )


def _v5_webhooks(db: Database) -> None:
    # The webhook registry (shardq.core._webhooks), one row per webhook id, the whole record in
    # `rec`. Only shard 0 reads it (it owns the registry), so it needs no index of its own.
    db.table("webhooks").create({"id": str, "rec": bytes}, pk="id", not_null={"rec"})


def _v6_flows(db: Database) -> None:
    # Flow notices a child's shard still owes a parent on another shard (shardq.core._flows),
    # stored in the batch that finished the child and deleted once the parent's shard has
    # committed them; `queue` is the child's, so each shard reloads only its own.
    db.table("flow_outbox").create(
        {"key": str, "queue": str, "rec": bytes}, pk="key", not_null={"queue", "rec"}
    )


def _v7_job_deltas(db: Database) -> None:
    # A job's `delta` ops (shardq.core._mutations): a log line, a child's result for its
    # parent. One row each, appended, so that an update costs its own bytes rather than a
    # rewrite of the job's row (shardq.storage._deltas). The index finds a job's ops when it
    # is read, folded or deleted. A database of version 6 has none: it needs no rewrite.
    db.execute(
        "CREATE TABLE job_deltas (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL, d BLOB NOT NULL)"
    )
    db.execute("CREATE INDEX idx_job_deltas_id ON job_deltas (id)")
    value = "patch entries may hold a delta op under the key \\x00delta"
    db.table("meta").insert({"key": "delta_encoding", "value": value})


def _v8_queue_groups(db: Database) -> None:
    # One row per configured job group (shardq.core._groups), so that changing one group's
    # settings writes that row and not, as before, its queue's config holding every group's
    # settings (each PauseGroup grew with the number of groups already configured). The
    # primary key's first column serves obliterate's `DELETE ... WHERE queue = ?`. The groups
    # stored in a queue's config move to their rows here.
    db.execute(
        "CREATE TABLE queue_groups (queue TEXT NOT NULL, gid TEXT NOT NULL, cfg BLOB NOT NULL,"
        " PRIMARY KEY (queue, gid))"
    )
    moved = []
    for name, blob in db.execute("SELECT name, cfg FROM queue_state").fetchall():
        cfg = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        groups = cfg.pop("groups", None) if isinstance(cfg, dict) else None
        if not isinstance(groups, dict):
            continue
        for gid, entry in groups.items():
            if isinstance(entry, dict):
                packed = msgpack.packb(entry, use_bin_type=True)
                db.execute("INSERT INTO queue_groups VALUES (?, ?, ?)", [name, str(gid), packed])
        moved.append((msgpack.packb(cfg, use_bin_type=True), name))
    for packed_cfg, name in moved:
        db.execute("UPDATE queue_state SET cfg = ? WHERE name = ?", [packed_cfg, name])


def _v9_cold_backlog(db: Database) -> None:
    # A shard under a memory budget leaves the cold rest of a queue in storage and pages it in,
    # in delivery order, and looks cold jobs up by uniqueKey (shardq.storage._cold_reads).
    # Only a cold row carries these columns (`_cold`): a hot one leaves them NULL, so a hot
    # push binds nothing more. Every index is partial on `cold = 1`, so a hot row enters none
    # of them, and the rows stored before them are hot by definition: nothing is filled, and
    # building the indexes reads the table once and writes no entry. An index ends with the
    # columns of its own condition (constant in it) only so that SQLite can count a queue's
    # cold jobs over the index alone (`cold_counts`), without reading a row.
    for column in ("cold INTEGER", "lifo INTEGER", "gid TEXT", "ukey TEXT"):
        db.execute(f"ALTER TABLE jobs ADD COLUMN {column}")
    db.execute(
        "CREATE INDEX idx_jobs_waiting ON jobs (queue, (-coalesce(priority, 0)), (-lifo),"
        " (CASE WHEN lifo = 1 THEN -seq ELSE coalesce(run_at, 0) END), seq, id, cold, state,"
        " gid) WHERE cold = 1 AND state = 'waiting' AND gid IS NULL"
    )
    db.execute(
        "CREATE INDEX idx_jobs_group_waiting ON jobs (queue, gid, (coalesce(priority, 0)),"
        " (coalesce(run_at, 0)), seq, id, cold, state)"
        " WHERE cold = 1 AND state = 'waiting' AND gid IS NOT NULL"
    )
    db.execute(
        "CREATE INDEX idx_jobs_delayed ON jobs (queue, (coalesce(run_at, 0)), seq, id, gid,"
        " cold, state) WHERE cold = 1 AND state = 'delayed'"
    )
    db.execute(
        "CREATE INDEX idx_jobs_unique ON jobs (queue, ukey, seq)"
        " WHERE cold = 1 AND ukey IS NOT NULL"
    )


def _v10_seq_by_temperature(db: Database) -> None:
    # A shard under a memory budget starts by loading its hot rows in seq order and finding
    # where its newest `max_completed` completed ones begin. Over one index of every row's
    # seq both walked the cold backlog too, reading each cold row to test it: at 10M cold jobs
    # 9 s and 7.5 s, growing with the backlog. The seq index is split in three, each row in
    # exactly one: the rows never marked cold (every row of a shard without a budget: its
    # writes cost what they did, as no update of theirs sets `cold`), the cold rows waiting
    # or delayed (the backlog, paged in through the cold indexes), and the cold rows in any
    # other state (paged in and taken since). A start reads the first and the last only. Only
    # a cold row's change of state moves its entry, which the budget pays.
    db.execute("DROP INDEX IF EXISTS idx_jobs_seq")
    for name, condition in SEQ_INDEXES.items():
        db.execute(f"CREATE INDEX {name} ON jobs (seq) WHERE {condition}")


def _v11_cold_made(db: Database) -> None:
    # The queue-wide reads of a shard under a memory budget (`_cold_reads.page_made`,
    # `page_by_seq`): GetJobs' first page in creation order and Clean's oldest jobs by seq,
    # read through an index in O(the page) rather than by reading every cold job of the
    # queue. A cold row keeps its record's `createdAt` in `made` (`_cold`); both indexes are
    # partial on the cold backlog (cold waiting and delayed rows), so a hot row's writes
    # touch neither and a budget pays two entries per cold job. Their trailing columns are
    # what the reads filter on, so that a row they skip is never read from the table. The
    # cold rows stored before get `made` from their records here (`backfill_made`).
    db.execute("ALTER TABLE jobs ADD COLUMN made INTEGER")
    backfill_made(db.conn, "?")
    for name, columns in MADE_INDEXES.items():
        db.execute(f"CREATE INDEX {name} ON jobs ({columns}) WHERE {COLD_BACKLOG}")


def backfill_made(conn: Any, mark: str) -> int:
    """Set `made` on every cold row from its record (a migration), a chunk of rows by id at a
    time (over the primary key, in its own collation), progress logged; the rows set.
    `mark`: the parameter placeholder."""
    read = (
        f"SELECT id, rec, patch FROM jobs WHERE id > {mark} AND cold = 1"
        f" ORDER BY id LIMIT {BACKFILL_CHUNK}"
    )
    write = f"UPDATE jobs SET made = {mark} WHERE id = {mark}"
    done, last = 0, ""
    while True:
        rows = conn.execute(read, [last]).fetchall()
        if not rows:
            return done
        sets = [(cold_state(bytes(r), bytes(p))[4] or 0, job_id) for job_id, r, p in rows]
        cursor = conn.cursor()
        cursor.executemany(write, sets)
        done += len(rows)
        last = rows[-1][0]
        if done % (BACKFILL_CHUNK * 50) == 0:
            migration_progress("made", done)


def _v12_cold_counts(db: Database) -> None:
    # A budgeted shard's start counted each queue's cold backlog over the paging indexes:
    # one entry read per cold job (2.2 s at 10M). Triggers now keep those counts in a table
    # in the same transaction as the rows (`_cold_count_table` says which rows and how); a
    # start reads a few rows. The rows already cold are counted once, here.
    for statement in _cold_count_table.SQLITE_MIGRATION:
        db.execute(statement)
    # Each queue's counts over the paging indexes alone, as the start counted them.
    count = count_over_indexes_sql(SQLITE)
    for (queue,) in db.execute(QUEUE_NAMES_SQL).fetchall():
        totals, groups = over_indexes_counts(db.execute(count, (queue,) * 4).fetchall())
        rows = _cold_count_table.table_rows(queue, totals, groups)
        db.conn.executemany("INSERT INTO cold_counts VALUES (?, ?, ?, ?, ?, ?)", rows)


def _v13_drain_pending(db: Database) -> None:
    # A Drain of a cold backlog deleted its range inside its batch: a million rows held the
    # writer, and every other commit, for 20-50 s. The batch now records the range here and
    # commits; the writer deletes it in short pieces afterwards, and every read leaves a
    # pending range out (`_drain_pending`).
    db.execute(DRAIN_PENDING_SQL)


def _v14_counted_on_cold(db: Database) -> None:
    # The count trigger on updates fired for every update of a job's state: a pull's and an
    # ack's of every hot job, for a WHEN clause that is false on a hot row, at a sub-program
    # call per row. It now fires only for an UPDATE that sets `cold`, and the writer sets
    # `cold = cold` where a row may be cold (`_write`), so a hot row's update leaves it out.
    # The insert trigger goes: the writer puts a cold row with `cold` NULL and then sets it,
    # which that trigger counts, so a hot put runs none. The counts and the rows stay as
    # they are.
    for statement in _cold_count_table.SQLITE_ON_COLD:
        db.execute(statement)


Migration = Callable[["Database"], None]

MADE_INDEXES: dict[str, str] = {
    "idx_jobs_cold_made": "queue, made, seq, id, cold, state, gid, priority",
    "idx_jobs_cold_by_seq": "queue, seq, id, made, cold, state, gid, priority",
}
"""The indexes of the queue-wide reads of the cold backlog (`_v11_cold_made`): columns."""
BACKFILL_CHUNK = 2000
"""Rows per read of `backfill_made`."""
QUEUE_NAMES_SQL = (
    "WITH RECURSIVE q(name) AS (SELECT (SELECT min(queue) FROM jobs) UNION ALL"
    " SELECT (SELECT min(queue) FROM jobs WHERE queue > q.name) FROM q WHERE q.name IS NOT NULL)"
    " SELECT name FROM q WHERE name IS NOT NULL"
)
"""The distinct queues of `jobs`, one seek of its `queue` index each (a skip scan): a shard's
start reads them, and `SELECT DISTINCT queue` read every entry of that index (0.3 s of CPU at
8,000,000 jobs, in every shard). The same SQL runs on PostgreSQL."""

SEQ_INDEXES: dict[str, str] = {
    "idx_jobs_seq": "cold IS NULL",
    "idx_jobs_cold_seq": "cold IS NOT NULL AND state IN ('waiting', 'delayed')",
    "idx_jobs_taken_seq": "cold IS NOT NULL AND state NOT IN ('waiting', 'delayed')",
}
"""The seq indexes from `SEQ_VERSION` on, by name: the condition of each (a partition of
the rows). A read over one names it (`INDEXED BY`) and repeats its condition."""
HOT_SEQ_INDEXES: tuple[str, ...] = ("idx_jobs_seq", "idx_jobs_taken_seq")
"""The seq indexes of the hot set (`_cold_reads.HOT_SET`): all but the cold backlog's."""

DELTAS_VERSION = 7
"""The schema version that added the `job_deltas` table."""
COLD_VERSION = 9
"""The schema version that added the cold columns and their indexes (`_v9_cold_backlog`)."""
SEQ_VERSION = 10
"""The schema version that split the seq index by temperature (`_v10_seq_by_temperature`)."""
MADE_VERSION = 11
"""The schema version that added `made` and the queue-wide cold indexes (`_v11_cold_made`)."""


def cold_columns(version: int) -> int:
    """How many cold columns (`_cold`) a jobs table of schema `version` has."""
    return cold_columns_at(version, COLD_VERSION, MADE_VERSION)


def cold_columns_at(version: int, cold_version: int, made_version: int) -> int:
    """`cold_columns` for a backend whose cold columns came at `cold_version` and `made` at
    `made_version` (PostgreSQL's numbers differ from SQLite's)."""
    if version >= made_version:
        return 5
    return 4 if version >= cold_version else 0


COUNTS_VERSION = 12
"""The schema version that keeps the cold counts in a table (`_v12_cold_counts`)."""
DRAIN_VERSION = 13
"""The schema version that deletes a Drain's range in pieces after its commit
(`_v13_drain_pending`)."""
DRAIN_PENDING_SQL = (
    "CREATE TABLE drain_pending (queue TEXT NOT NULL PRIMARY KEY, above INTEGER,"
    " seq INTEGER NOT NULL) WITHOUT ROWID"
)
"""One row per queue whose Drain's range is not deleted yet: its seq bounds (`above`
exclusive, NULL for none; `seq` inclusive)."""
COUNTED_ON_COLD_VERSION = 14
"""The schema version whose count trigger on updates fires only when `cold` is set, and that
has no count trigger on inserts (`_v14_counted_on_cold`)."""

# Append only. The database's schema version is the number of migrations applied to it.
MIGRATIONS: list[Migration] = [
    _v1_initial,
    _v2_patch,
    _v3_narrow_indexes,
    _v4_cron_jobs,
    _v5_webhooks,
    _v6_flows,
    _v7_job_deltas,
    _v8_queue_groups,
    _v9_cold_backlog,
    _v10_seq_by_temperature,
    _v11_cold_made,
    _v12_cold_counts,
    _v13_drain_pending,
    _v14_counted_on_cold,
]


def database(conn: sqlite3.Connection) -> Database:
    """sqlite-utils' view of `conn`, for the migrations and `describe`."""
    from sqlite_utils import Database

    return Database(conn, recursive_triggers=False, execute_plugins=False)


def migrate(conn: sqlite3.Connection, db: Database | None = None) -> int:
    """Bring the database up to the newest schema; return its version.

    Safe to call on every open: an up-to-date database is left untouched (and `db`, made
    from `conn` when not given, is made only if a migration runs). Raises `StorageError` if
    the database was written by a newer shardq (its version is higher than the number of
    migrations known here), or if a migration fails (that migration is rolled back, earlier
    ones stay).
    """
    with transaction(conn, "creating the migrations table"):
        if _create_fresh(conn):
            return len(MIGRATIONS)
        conn.execute(
            "CREATE TABLE IF NOT EXISTS migrations ("
            "version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
    while True:
        # Re-read the version inside each transaction: another process may have migrated
        # between our steps, and the write lock makes the check and the step atomic.
        with transaction(conn, "migrating the schema"):
            version = _current_version(conn)
            known = len(MIGRATIONS)
            if version > known:
                raise StorageError(
                    f"the database has schema version {version}, newer than version {known} "
                    "that this shardq knows; upgrade shardq to open it"
                )
            if version == known:
                return version
            db = db if db is not None else database(conn)
            migration_step("sqlite", version, partial(MIGRATIONS[version], db))
            conn.execute(
                "INSERT INTO migrations (version, applied_at) VALUES (?, datetime('now'))",
                [version + 1],
            )


def _create_fresh(conn: sqlite3.Connection) -> bool:
    """On a file that holds no table yet, make the newest schema at once from its script
    (`_schema_fresh.py`: no sqlite-utils, one transaction); False if the file is not new or
    the script is older than the migrations known here (then they run one by one)."""
    if len(MIGRATIONS) != fresh.VERSION:
        return False
    if conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is not None:
        return False

    def create() -> None:
        for statement in fresh.STATEMENTS:
            conn.execute(statement)
        conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", fresh.META_ROWS)
        conn.executemany(
            "INSERT INTO migrations (version, applied_at) VALUES (?, datetime('now'))",
            [(version,) for version in range(1, fresh.VERSION + 1)],
        )

    schema_creation("sqlite", fresh.VERSION, create)
    return True


def _current_version(conn: sqlite3.Connection) -> int:
    (version,) = conn.execute("SELECT coalesce(max(version), 0) FROM migrations").fetchone()
    return int(version)


@dataclass(frozen=True)
class SchemaInfo:
    """What the database holds, as read back from SQLite (for tests and admin commands)."""

    version: int
    migrations: tuple[int, ...]
    """Every version recorded in the `migrations` table, ascending."""
    columns: Mapping[str, tuple[tuple[str, str, bool], ...]]
    """Table name to its columns as (name, declared type, NOT NULL)."""
    indexes: Mapping[str, tuple[tuple[str, ...], ...]]
    """Table name to the column lists of its explicit indexes, sorted."""


def describe(conn: sqlite3.Connection) -> SchemaInfo:
    """Read the schema back. Raises `StorageError` if SQLite fails."""
    db = database(conn)
    try:
        applied = tuple(
            int(v) for (v,) in db.execute("SELECT version FROM migrations ORDER BY version")
        )
        columns: dict[str, tuple[tuple[str, str, bool], ...]] = {}
        indexes: dict[str, tuple[tuple[str, ...], ...]] = {}
        for table in db.tables:
            columns[table.name] = tuple(
                (str(c.name), str(c.type), bool(c.notnull)) for c in table.columns
            )
            # origin "c" = made by CREATE INDEX; skip the implicit primary-key indexes. SQLite
            # names no column for an expression.
            indexes[table.name] = tuple(
                sorted(
                    tuple(c if c is not None else "<expr>" for c in ix.columns)
                    for ix in table.indexes
                    if ix.origin == "c"
                )
            )
    except sqlite3.Error as e:
        raise wrap_error(e, "reading the schema") from e
    return SchemaInfo(
        version=applied[-1] if applied else 0,
        migrations=applied,
        columns=columns,
        indexes=indexes,
    )
