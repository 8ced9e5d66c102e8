"""The PostgreSQL backend's schema, its forward migrations and its error mapping.

The same tables as the SQLite schema (`_schema`), in PostgreSQL's types, versioned the same
way: `MIGRATIONS[i]` takes a schema at version `i` to version `i + 1`, and the `migrations`
table records every version applied. Each migration runs in its own transaction with its
record, under an advisory lock, so two processes opening the same schema at once migrate it
once and a crash mid-migration leaves the previous version intact. Append only.

PostgreSQL's versions count on their own: version 4 here is not SQLite's version 4. Both
hold the same data: a job row is `rec` plus `patch` (shardq.storage._store), its `delta`
ops are rows of `job_deltas` (shardq.storage._deltas), and recovery reads rows in
(seq, ord) order, where `ord` is the insertion order SQLite gets from its rowid.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.rows import TupleRow

from shardq.storage import _cold_count_table, _schema
from shardq.storage._errors import StorageError, StorageFull, StorageRejected
from shardq.storage._progress import migration_step

__all__ = [
    "CLUSTER_VERSION",
    "COLD_VERSION",
    "COUNTS_VERSION",
    "DELTAS_VERSION",
    "DRAIN_VERSION",
    "GROUPS_VERSION",
    "HOT_SEQ_CONDITIONS",
    "MADE_INDEXES",
    "MADE_VERSION",
    "MIGRATIONS",
    "SEQ_INDEXES",
    "SEQ_VERSION",
    "Conn",
    "cold_columns",
    "migrate",
    "pg_error",
]

Conn = psycopg.Connection[TupleRow]
Migration = Callable[[Conn], None]


def _v1_jobs(conn: Conn) -> None:
    # The columns are for queries and recovery order; the record is in `rec` and `patch`.
    # `ord` numbers rows as inserted; an upsert keeps it, as SQLite keeps a rowid. fillfactor
    # leaves room in each page so that a job's updates, which touch no indexed column but
    # `seq`, can be HOT updates that rewrite no index entry.
    conn.execute(
        "CREATE TABLE jobs (id text PRIMARY KEY, queue text NOT NULL, state text NOT NULL,"
        " priority double precision, run_at bigint, seq bigint NOT NULL,"
        " ord bigint GENERATED ALWAYS AS IDENTITY, rec bytea NOT NULL,"
        " patch bytea NOT NULL DEFAULT ''::bytea) WITH (fillfactor = 85)"
    )
    # Recovery pages through (seq, ord); obliterate deletes by queue (SQLite's reasons, v3).
    conn.execute("CREATE INDEX jobs_seq_ord ON jobs (seq, ord)")
    conn.execute("CREATE INDEX jobs_queue ON jobs (queue)")
    conn.execute("CREATE TABLE queue_state (name text PRIMARY KEY, cfg bytea NOT NULL)")
    conn.execute("CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL)")
    conn.execute(
        "INSERT INTO meta (key, value) VALUES ('record_encoding', 'msgpack'),"
        " ('patch_encoding', 'repeated: u32 big-endian length, then a msgpack map')"
    )


def _v2_keyed_records(conn: Conn) -> None:
    # Cron schedules, webhooks and the flow outbox: one row per key, the record in `rec`.
    conn.execute(
        "CREATE TABLE cron_jobs (name text PRIMARY KEY, queue text NOT NULL, rec bytea NOT NULL)"
    )
    conn.execute("CREATE TABLE webhooks (id text PRIMARY KEY, rec bytea NOT NULL)")
    conn.execute(
        "CREATE TABLE flow_outbox (key text PRIMARY KEY, queue text NOT NULL, rec bytea NOT NULL)"
    )


def _v3_job_deltas(conn: Conn) -> None:
    # A job's `delta` ops, one row each, applied in `ord` order (shardq.storage._deltas).
    conn.execute(
        "CREATE TABLE job_deltas (ord bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " id text NOT NULL, d bytea NOT NULL)"
    )
    conn.execute("CREATE INDEX job_deltas_id ON job_deltas (id)")
    conn.execute(
        "INSERT INTO meta (key, value) VALUES"
        " ('delta_encoding', 'patch entries may hold a delta op under the key \\x00delta')"
    )


def _v4_queue_groups(conn: Conn) -> None:
    # One row per configured job group, so that one group's change writes one row.
    conn.execute(
        "CREATE TABLE queue_groups (queue text NOT NULL, gid text NOT NULL, cfg bytea NOT NULL,"
        " PRIMARY KEY (queue, gid))"
    )


def _v5_cluster(conn: Conn) -> None:
    # Several nodes on one database (shardq.cluster._leases, docs/cluster.md). A node's row
    # says where it is and when it last proved alive (the database's clock). `session` is
    # the running process's: a second live process under the same id is refused.
    conn.execute(
        "CREATE TABLE cluster_nodes (id text PRIMARY KEY, address text NOT NULL,"
        " session text NOT NULL, started_at timestamptz NOT NULL DEFAULT now(),"
        " heartbeat_at timestamptz NOT NULL)"
    )
    # One row per partition, made at the first start with the configured count. `epoch` is
    # the fencing token: it grows at every change of owner, and a write batch checks, in its
    # own transaction, that the epochs it was given are still the ones in these rows
    # (shardq.storage._pg_fence).
    conn.execute(
        "CREATE TABLE partition_leases (partition integer PRIMARY KEY, owner text,"
        " epoch bigint NOT NULL DEFAULT 0,"
        " expires_at timestamptz NOT NULL DEFAULT '-infinity')"
    )


def _v6_cold_backlog(conn: Conn) -> None:
    # The SQLite schema's version 9 (`_schema._v9_cold_backlog` says why): only a cold row
    # carries these columns and enters these indexes, and nothing stored before is filled.
    # The row key is indexed in the "C" collation: the engine orders ids by code point, not
    # by the database's locale (`_cold_reads`).
    conn.execute(
        "ALTER TABLE jobs ADD COLUMN cold smallint, ADD COLUMN lifo smallint,"
        " ADD COLUMN gid text, ADD COLUMN ukey text"
    )
    conn.execute(
        "CREATE INDEX jobs_waiting ON jobs (queue, (-coalesce(priority, 0)), (-lifo),"
        ' (CASE WHEN lifo = 1 THEN -seq ELSE coalesce(run_at, 0) END), seq, id COLLATE "C")'
        " WHERE cold = 1 AND state = 'waiting' AND gid IS NULL"
    )
    conn.execute(
        "CREATE INDEX jobs_group_waiting ON jobs (queue, gid, (coalesce(priority, 0)),"
        ' (coalesce(run_at, 0)), seq, id COLLATE "C")'
        " WHERE cold = 1 AND state = 'waiting' AND gid IS NOT NULL"
    )
    conn.execute(
        'CREATE INDEX jobs_delayed ON jobs (queue, (coalesce(run_at, 0)), seq, id COLLATE "C",'
        " gid) WHERE cold = 1 AND state = 'delayed'"
    )
    conn.execute(
        "CREATE INDEX jobs_unique ON jobs (queue, ukey, seq) WHERE cold = 1 AND ukey IS NOT NULL"
    )


def _v7_seq_by_temperature(conn: Conn) -> None:
    # The SQLite schema's version 10 (`_schema._v10_seq_by_temperature` says why): the seq
    # index split in three partial ones, so that a budgeted start reads its hot rows and its
    # completed window without walking the cold backlog. An update that changes `state` was
    # no HOT update already (the cold indexes' conditions name it), so a hot row's writes
    # touch one seq index as before.
    conn.execute("DROP INDEX IF EXISTS jobs_seq_ord")
    for name, condition in SEQ_INDEXES.items():
        conn.execute(f"CREATE INDEX {name} ON jobs (seq, ord) WHERE {condition}")


def _v8_cold_made(conn: Conn) -> None:
    # The SQLite schema's version 11 (`_schema._v11_cold_made` says why): `made` on cold rows,
    # filled for those stored before, and the two indexes of the queue-wide cold reads.
    conn.execute("ALTER TABLE jobs ADD COLUMN made bigint")
    _schema.backfill_made(conn, "%s")
    for name, columns in MADE_INDEXES.items():
        conn.execute(f"CREATE INDEX {name} ON jobs ({columns}) WHERE {_schema.COLD_BACKLOG}")


MADE_INDEXES: dict[str, str] = {
    "jobs_cold_made": 'queue, made, seq, id COLLATE "C"',
    "jobs_cold_by_seq": 'queue, seq, id COLLATE "C"',
}
"""The indexes of the queue-wide cold reads (`_schema.MADE_INDEXES`), by name: columns."""


def _v9_cold_counts(conn: Conn) -> None:
    # The SQLite schema's version 12 (`_schema._v12_cold_counts` says why): the cold counts
    # kept by triggers in a table of their own, the rows already cold counted once here.
    for statement in _cold_count_table.PG_MIGRATION:
        conn.execute(statement)
    conn.execute(_cold_count_table.PG_FILL)


def _v10_counted_by_statement(conn: Conn) -> None:
    # The trigger function can be told to leave a statement's rows to the statement: a
    # Drain's range deletion (`_drain`) counts its rows per key itself. Counted by the
    # trigger, a million rows deleted in one transaction updated the same count row a
    # million times, each update walking past the versions the earlier ones left.
    conn.execute(_cold_count_table.PG_SKIPPING_FUNCTION)


def _v11_drain_pending(conn: Conn) -> None:
    # The SQLite schema's version 13 (`_schema._v13_drain_pending` says why): a Drain's batch
    # records its range here and commits; the writer deletes the rows in short pieces after,
    # and every read leaves a pending range out (`_drain_pending`, `_pg_drain`). Deleted inside
    # the batch, 200,000 cold rows held every other commit of the node, and the rows' locks.
    conn.execute(
        "CREATE TABLE drain_pending (queue text PRIMARY KEY, above bigint, seq bigint NOT NULL)"
    )


SEQ_INDEXES: dict[str, str] = dict(
    zip(
        ("jobs_seq_ord", "jobs_cold_seq", "jobs_taken_seq"),
        _schema.SEQ_INDEXES.values(),
        strict=True,
    )
)
"""The seq indexes from `SEQ_VERSION` on: the condition of each (`_schema.SEQ_INDEXES`)."""
HOT_SEQ_CONDITIONS: tuple[str, ...] = (SEQ_INDEXES["jobs_seq_ord"], SEQ_INDEXES["jobs_taken_seq"])
"""The conditions of the hot set's seq indexes (all but the cold backlog's)."""
DELTAS_VERSION = 3
"""The schema version that added `job_deltas`."""
GROUPS_VERSION = 4
"""The schema version that added `queue_groups`."""
CLUSTER_VERSION = 5
"""The schema version that added the cluster's tables (`cluster_nodes`, `partition_leases`)."""
COLD_VERSION = 6
"""The schema version that added the cold columns and their indexes (`_v6_cold_backlog`)."""
SEQ_VERSION = 7
"""The schema version that split the seq index by temperature (`_v7_seq_by_temperature`)."""
MADE_VERSION = 8
"""The schema version that added `made` and the queue-wide cold indexes (`_v8_cold_made`)."""


def cold_columns(version: int) -> int:
    """How many cold columns (`_cold`) a jobs table of schema `version` has."""
    return _schema.cold_columns_at(version, COLD_VERSION, MADE_VERSION)


COUNTS_VERSION = 9
"""The schema version that keeps the cold counts in a table (`_v9_cold_counts`)."""
COUNTED_VERSION = 10
"""The schema version whose count trigger a statement can keep out (`_v10_...`)."""
DRAIN_VERSION = 11
"""The schema version that deletes a Drain's range in pieces after its commit
(`_v11_drain_pending`)."""

# Append only. A schema's version is the number of migrations applied to it.
MIGRATIONS: list[Migration] = [
    _v1_jobs,
    _v2_keyed_records,
    _v3_job_deltas,
    _v4_queue_groups,
    _v5_cluster,
    _v6_cold_backlog,
    _v7_seq_by_temperature,
    _v8_cold_made,
    _v9_cold_counts,
    _v10_counted_by_statement,
    _v11_drain_pending,
]


def migrate(conn: Conn, schema: str | None) -> int:
    """Create `schema` if given (else use the connection's search path), bring it up to the
    newest version and return the version. `conn` is in autocommit mode.

    Raises `StorageError` if the schema is newer than this code knows, or a migration fails
    (that migration is rolled back, earlier ones stay).
    """
    while True:
        with conn.transaction():
            # One lock per schema: a concurrent opener waits here, then sees the new version.
            where = schema if schema is not None else "(search path)"
            key = f"shardq migrations {where}"
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))
            if schema is not None:
                create = sql.SQL("CREATE SCHEMA IF NOT EXISTS {}")
                conn.execute(create.format(sql.Identifier(schema)))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS migrations (version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT coalesce(max(version), 0) FROM migrations").fetchone()
            version = int(row[0]) if row is not None else 0
            known = len(MIGRATIONS)
            if version > known:
                raise StorageError(
                    f"the database has schema version {version}, newer than version {known} "
                    "that this shardq knows; upgrade shardq to open it"
                )
            if version == known:
                return version
            migration_step("postgresql", version, partial(MIGRATIONS[version], conn))
            conn.execute("INSERT INTO migrations (version) VALUES (%s)", (version + 1,))


# SQLSTATE classes that blame the statement's values: 22 data exception (a number out of
# range, a string PostgreSQL cannot store), 23 integrity constraint violation.
_REJECTING = (psycopg.DataError, psycopg.IntegrityError)


def pg_error(exc: BaseException, action: str) -> StorageError:
    """Turn a failure during `action` into a `StorageError`, `StorageFull` or
    `StorageRejected`, as `_errors.wrap_error` does for SQLite. The caller raises it
    `from exc`."""
    if isinstance(exc, pg_errors.DiskFull):
        return StorageFull(f"{action}: database or disk is full ({exc})")
    if not isinstance(exc, psycopg.Error) or isinstance(exc, _REJECTING):
        # Our own code's errors on the batch's values (OverflowError, TypeError from msgpack,
        # a malformed mutation), or PostgreSQL refusing a value: retrying fails the same way.
        return StorageRejected(f"{action}: {type(exc).__name__}: {exc}")
    # Anything else (the connection lost, the server shutting down, a lock timeout) may pass.
    return StorageError(f"{action}: {type(exc).__name__}: {exc}")
