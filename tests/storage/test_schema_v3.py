"""Schema version 3: only the indexes some query of the server reads.

Version 3 drops `state` and `(queue, state, seq)` and adds `(queue)`. These tests migrate a
version 2 database written by the store itself (rows with patches, queue configs) and open a
fresh one; and they pin, with EXPLAIN QUERY PLAN, that every statement the store runs still
finds its rows through an index, so dropping an index can never quietly turn a read into a
scan of the whole table.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from shardq.core import Engine
from shardq.storage import (
    MutationEncoder,
    Store,
    _schema,
    _seq_reads,
    _store_loads,
    _write,
    _write_puts,
    _write_updates,
)

Rec = dict[str, Any]
V3_INDEXES = (("queue",), ("seq",))
# Version 9 adds the partial indexes the cold backlog's reads use (test_cold_store.py).
E = "<expr>"
COLD_INDEXES = (
    ("queue", E, E, E, "seq", "id", "cold", "state", "gid"),
    ("queue", "gid", E, E, "seq", "id", "cold", "state"),
    ("queue", E, "seq", "id", "gid", "cold", "state"),
    ("queue", "ukey", "seq"),
)
# Version 10 splits the seq index in three partial ones (`_schema.SEQ_INDEXES`); version 11
# adds the queue-wide reads' two (`_schema.MADE_INDEXES`).
MADE_INDEXES = (
    ("queue", "made", "seq", "id", "cold", "state", "gid", "priority"),
    ("queue", "seq", "id", "made", "cold", "state", "gid", "priority"),
)
NEWEST_INDEXES = tuple(sorted((("queue",),) + (("seq",),) * 3 + COLD_INDEXES + MADE_INDEXES))
V2_INDEXES = (("queue", "state", "seq"), ("seq",), ("state",))


def _open_at_version(path: Path, version: int, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A store whose database was migrated only up to `version`, as older code left it."""
    with monkeypatch.context() as m:
        m.setattr(_schema, "MIGRATIONS", _schema.MIGRATIONS[:version])
        return Store.open(path)


def _engine_batches() -> list[list[Any]]:
    """Real engine traffic over two queues: pushes, a pull, acks, a failure, a config."""
    engine, now = Engine(seed=7), 1_700_000_000_000
    batches = []
    for queue in ("qa", "qb"):
        jobs = [{"data": {"i": i}} for i in range(30)]
        batches.append(engine.apply({"cmd": "PUSHB", "queue": queue, "jobs": jobs}, now).mutations)
        pull = {"cmd": "PULLB", "queue": queue, "count": 20, "owner": "w"}
        reply, muts = (outcome := engine.apply(pull, now + 1)).reply, outcome.mutations
        batches.append(muts)
        ids, tokens = [j["id"] for j in reply["jobs"]], reply["tokens"]
        ack = {"cmd": "ACKB", "ids": ids[:15], "tokens": tokens[:15]}
        batches.append(engine.apply(ack, now + 2).mutations)
        fail = {"cmd": "FAIL", "id": ids[15], "token": tokens[15], "error": "boom"}
        batches.append(engine.apply(fail, now + 3).mutations)
    batches.append(engine.apply({"cmd": "Pause", "queue": "qb"}, now + 4).mutations)
    return [b for b in batches if b]


def _written_by_v2(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Rec], dict[str, Rec]]:
    encode = MutationEncoder().encode
    with _open_at_version(path, 2, monkeypatch) as v2:
        assert v2.describe().indexes["jobs"] == V2_INDEXES
        for batch in _engine_batches():
            v2.apply(encode(batch))
        jobs, queues = list(v2.load_jobs()), v2.load_queues()
    assert len(jobs) == 60 and any(rec["state"] == "completed" for rec in jobs)
    assert queues  # the paused queue's config
    return jobs, queues


def test_a_fresh_database_has_only_the_queue_and_seq_indexes(tmp_path: Path) -> None:
    with Store.open(tmp_path / "new.db") as store:
        info = store.describe()
        newest = len(_schema.MIGRATIONS)  # later migrations add tables and v9's indexes
        assert info.version == store.schema_version == newest
        assert info.migrations == tuple(range(1, newest + 1))
        assert info.indexes["jobs"] == NEWEST_INDEXES


def test_a_version_2_database_with_jobs_migrates_and_recovers_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v2.db"
    jobs, queues = _written_by_v2(path, monkeypatch)
    with Store.open(path) as store:
        info = store.describe()
        newest = len(_schema.MIGRATIONS)
        assert (info.version, info.migrations) == (newest, tuple(range(1, newest + 1)))
        assert info.indexes["jobs"] == NEWEST_INDEXES
        assert list(store.load_jobs(page_size=7)) == jobs  # same records, same seq order
        assert store.load_queues() == queues
        counts: dict[str, int] = {}
        for rec in jobs:
            if rec["queue"] == "qa":
                counts[rec["state"]] = counts.get(rec["state"], 0) + 1
        assert store.count_by_state("qa") == counts
        # The migrated rows take updates and an obliterate like new ones.
        first = jobs[0]["id"]
        store.apply([("upd", first, {"state": "failed", "attempts": 9})])
        store.apply([("qdel", "qb")])
        assert store.get_job(first) == {**jobs[0], "state": "failed", "attempts": 9}
    with Store.open(path) as again:
        assert again.describe() == info  # reopening migrates nothing more
        left = list(again.load_jobs())
        assert {rec["queue"] for rec in left} == {"qa"} and len(left) == 30


def test_the_migration_runs_once_and_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v2.db"
    _written_by_v2(path, monkeypatch)
    for _ in range(2):
        with Store.open(path):
            pass
    with sqlite3.connect(path) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM migrations ORDER BY 1")]
    assert versions == list(range(1, len(_schema.MIGRATIONS) + 1))


# -- every statement the store runs reads through an index ---------------------------------------

_SHARD_QUEUES = ("qa", "qb", "qc")
_SHARD_FILTER = _store_loads._filter(_SHARD_QUEUES)[0]
_RECOVERY_FILTER = f"{_SHARD_FILTER} AND (state != 'completed' OR seq >= ?)"

_STATEMENTS: dict[str, tuple[str, tuple[Any, ...], str]] = {
    # name: (sql, parameters, the index its plan must use)
    # Reads in seq order go over the split seq indexes (`_seq_reads`), each part its own;
    # the shard's filter and the retained window of completed jobs ride along.
    **{
        f"recovery, {which}": (
            _seq_reads.page_sql(_RECOVERY_FILTER, _seq_reads.parts(which == "hot set")),
            _seq_reads.page_params(
                (1, 1), (*_SHARD_QUEUES, 5), 10, _seq_reads.parts(which == "hot set")
            ),
            "idx_jobs_seq",
        )
        for which in ("hot set", "every job")
    },
    "retained completed window": (
        _seq_reads.completed_floor_sql(_SHARD_FILTER),
        (*_SHARD_QUEUES, 101, *_SHARD_QUEUES, 101, 100),
        "idx_jobs_taken_seq",
    ),
    "stale completed rows of a queue": (
        _store_loads._STALE_OF_QUEUE,
        ("q", 5, 0, 10),
        "idx_jobs_queue",
    ),
    "highest seq": (_seq_reads.max_seq_sql(), (), "idx_jobs_cold_seq"),
    "obliterate": (_write._DELETE_QUEUE_JOBS, ("q",), "idx_jobs_queue"),
    "count by state": (
        "SELECT state, count(*) FROM jobs WHERE queue = ? GROUP BY state",
        ("q",),
        "idx_jobs_queue",
    ),
    # The writer's statements over many rows (`_rows`), here over two.
    "delete jobs": (
        _write_puts._DELETE_JOBS.format(rows="(?), (?)"),
        ("j", "k"),
        "sqlite_autoindex_jobs_1",
    ),
    "fold": (_write._FOLDED, (b"", "j"), "sqlite_autoindex_jobs_1"),
    "update": (
        _write_updates._update_sql(("state",)).format(rows="(?, ?, ?), (?, ?, ?)"),
        ("s", b"", "j", "t", b"", "k"),
        "sqlite_autoindex_jobs_1",
    ),
    "row summary": (
        "SELECT id, queue, length(rec), length(patch) FROM jobs WHERE id IN (?, ?)",
        ("a", "b"),
        "sqlite_autoindex_jobs_1",
    ),
    "one job": ("SELECT rec, patch FROM jobs WHERE id = ?", ("j",), "sqlite_autoindex_jobs_1"),
}


@pytest.mark.parametrize("name", sorted(_STATEMENTS))
def test_every_job_read_uses_an_index(tmp_path: Path, name: str) -> None:
    sql, params, index = _STATEMENTS[name]
    with Store.open(tmp_path / "plan.db"):
        pass
    with sqlite3.connect(tmp_path / "plan.db") as conn:
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    assert any(f"INDEX {index}" in step for step in plan), plan
    # A plain `SCAN jobs` (no index) reads the whole table.
    assert not any(step.startswith("SCAN jobs") and "INDEX" not in step for step in plan), plan
    # A sort would read every matching row again for each page of a paged read; the reads in
    # seq order sort only the rows each part's LIMIT let through, to merge them.
    if name.startswith("stale"):
        assert not any("TEMP B-TREE" in step for step in plan), plan
    if name.startswith(("recovery", "retained", "highest")):
        used = {i for i in _schema.SEQ_INDEXES for step in plan if f"INDEX {i} " in f"{step} "}
        backlog = name != "recovery, every job" and name != "highest seq"
        assert "idx_jobs_cold_seq" not in used if backlog else "idx_jobs_cold_seq" in used, plan
        assert not any(step.startswith("SCAN jobs") and "INDEX" not in step for step in plan)
