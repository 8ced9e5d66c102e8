"""The newest SQLite schema as one script: how a new, empty database file is made.

A new file would otherwise go through every migration in `_schema.py` one after the other,
each its own transaction, and import sqlite-utils for them: a quarter of the writer's start
(257 million instructions for the import alone) at every start on a new data path, every
test's among them. `_schema.migrate` runs this script instead, in one transaction, when the
file holds no table at all and `VERSION` is the number of migrations it knows; otherwise (an
existing file, or a migration appended without this file made again) it migrates as before.

Made from a file that every migration brought up to `VERSION` (`sqlite_master`'s statements in
their order, and the rows the migrations wrote), not written by hand;
`tests/storage/test_fresh_schema.py` checks it against such a file and prints this module anew
when they differ. The `migrations` rows (1 to `VERSION`) are written by `migrate`.
"""

# ruff: noqa: E501  # made, not written: each statement exactly as SQLite stored it

from __future__ import annotations

from typing import Final

__all__ = ["META_ROWS", "STATEMENTS", "VERSION"]

VERSION: Final = 14

STATEMENTS: Final[tuple[str, ...]] = (
    "CREATE TABLE migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)",
    'CREATE TABLE "jobs" (\n   "id" TEXT PRIMARY KEY,\n   "queue" TEXT NOT NULL,\n   "state" TEXT NOT NULL,\n   "priority" REAL,\n   "run_at" INTEGER,\n   "seq" INTEGER NOT NULL,\n   "rec" BLOB NOT NULL\n, patch BLOB NOT NULL DEFAULT x\'\', cold INTEGER, lifo INTEGER, gid TEXT, ukey TEXT, made INTEGER)',
    'CREATE TABLE "queue_state" (\n   "name" TEXT PRIMARY KEY,\n   "cfg" BLOB NOT NULL\n)',
    'CREATE TABLE "meta" (\n   "key" TEXT PRIMARY KEY,\n   "value" TEXT\n)',
    "CREATE INDEX idx_jobs_queue ON jobs (queue)",
    'CREATE TABLE "cron_jobs" (\n   "name" TEXT PRIMARY KEY,\n   "queue" TEXT NOT NULL,\n   "rec" BLOB NOT NULL\n)',
    'CREATE TABLE "webhooks" (\n   "id" TEXT PRIMARY KEY,\n   "rec" BLOB NOT NULL\n)',
    'CREATE TABLE "flow_outbox" (\n   "key" TEXT PRIMARY KEY,\n   "queue" TEXT NOT NULL,\n   "rec" BLOB NOT NULL\n)',
    "CREATE TABLE job_deltas (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL, d BLOB NOT NULL)",
    "CREATE INDEX idx_job_deltas_id ON job_deltas (id)",
    "CREATE TABLE queue_groups (queue TEXT NOT NULL, gid TEXT NOT NULL, cfg BLOB NOT NULL, PRIMARY KEY (queue, gid))",
    "CREATE INDEX idx_jobs_waiting ON jobs (queue, (-coalesce(priority, 0)), (-lifo), (CASE WHEN lifo = 1 THEN -seq ELSE coalesce(run_at, 0) END), seq, id, cold, state, gid) WHERE cold = 1 AND state = 'waiting' AND gid IS NULL",
    "CREATE INDEX idx_jobs_group_waiting ON jobs (queue, gid, (coalesce(priority, 0)), (coalesce(run_at, 0)), seq, id, cold, state) WHERE cold = 1 AND state = 'waiting' AND gid IS NOT NULL",
    "CREATE INDEX idx_jobs_delayed ON jobs (queue, (coalesce(run_at, 0)), seq, id, gid, cold, state) WHERE cold = 1 AND state = 'delayed'",
    "CREATE INDEX idx_jobs_unique ON jobs (queue, ukey, seq) WHERE cold = 1 AND ukey IS NOT NULL",
    "CREATE INDEX idx_jobs_seq ON jobs (seq) WHERE cold IS NULL",
    "CREATE INDEX idx_jobs_cold_seq ON jobs (seq) WHERE cold IS NOT NULL AND state IN ('waiting', 'delayed')",
    "CREATE INDEX idx_jobs_taken_seq ON jobs (seq) WHERE cold IS NOT NULL AND state NOT IN ('waiting', 'delayed')",
    "CREATE INDEX idx_jobs_cold_made ON jobs (queue, made, seq, id, cold, state, gid, priority) WHERE cold = 1 AND state IN ('waiting', 'delayed')",
    "CREATE INDEX idx_jobs_cold_by_seq ON jobs (queue, seq, id, made, cold, state, gid, priority) WHERE cold = 1 AND state IN ('waiting', 'delayed')",
    "CREATE TABLE cold_counts (queue TEXT NOT NULL, state TEXT NOT NULL, grouped INTEGER NOT NULL, gid TEXT NOT NULL, prio INTEGER NOT NULL, n BIGINT NOT NULL, PRIMARY KEY (queue, state, grouped, gid, prio)) WITHOUT ROWID",
    "CREATE TRIGGER cold_counts_delete AFTER DELETE ON jobs WHEN old.cold = 1 AND old.state IN ('waiting', 'delayed') BEGIN DELETE FROM cold_counts WHERE 1 AND queue = old.queue AND state = old.state AND grouped = CASE WHEN old.gid IS NULL THEN 0 ELSE 1 END AND gid = coalesce(old.gid, '') AND prio = (old.state = 'waiting' AND old.gid IS NULL AND coalesce(old.priority, 0) > 0) AND n <= 1; UPDATE cold_counts SET n = n - 1 WHERE 1 AND queue = old.queue AND state = old.state AND grouped = CASE WHEN old.gid IS NULL THEN 0 ELSE 1 END AND gid = coalesce(old.gid, '') AND prio = (old.state = 'waiting' AND old.gid IS NULL AND coalesce(old.priority, 0) > 0); END",
    "CREATE TABLE drain_pending (queue TEXT NOT NULL PRIMARY KEY, above INTEGER, seq INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TRIGGER cold_counts_update AFTER UPDATE OF cold ON jobs WHEN (old.cold = 1 AND old.state IN ('waiting', 'delayed') OR new.cold = 1 AND new.state IN ('waiting', 'delayed')) AND NOT (old.queue IS new.queue AND old.state IS new.state AND old.cold IS new.cold AND old.gid IS new.gid AND old.priority IS new.priority) BEGIN DELETE FROM cold_counts WHERE old.cold = 1 AND old.state IN ('waiting', 'delayed') AND queue = old.queue AND state = old.state AND grouped = CASE WHEN old.gid IS NULL THEN 0 ELSE 1 END AND gid = coalesce(old.gid, '') AND prio = (old.state = 'waiting' AND old.gid IS NULL AND coalesce(old.priority, 0) > 0) AND n <= 1; UPDATE cold_counts SET n = n - 1 WHERE old.cold = 1 AND old.state IN ('waiting', 'delayed') AND queue = old.queue AND state = old.state AND grouped = CASE WHEN old.gid IS NULL THEN 0 ELSE 1 END AND gid = coalesce(old.gid, '') AND prio = (old.state = 'waiting' AND old.gid IS NULL AND coalesce(old.priority, 0) > 0); INSERT INTO cold_counts SELECT new.queue, new.state, CASE WHEN new.gid IS NULL THEN 0 ELSE 1 END, coalesce(new.gid, ''), (new.state = 'waiting' AND new.gid IS NULL AND coalesce(new.priority, 0) > 0), 1 WHERE new.cold = 1 AND new.state IN ('waiting', 'delayed') ON CONFLICT DO UPDATE SET n = n + 1; END",
)

META_ROWS: Final[tuple[tuple[str, str], ...]] = (
    ("record_encoding", "msgpack"),
    ("patch_encoding", "repeated: u32 big-endian length, then a msgpack map"),
    ("delta_encoding", "patch entries may hold a delta op under the key \\x00delta"),
)
