"""Opening a store says what its migrations do: a long one must not look like a hung server."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shardq.storage import _schema
from shardq.storage._store import Store


def test_each_migration_step_is_logged_with_its_time(tmp_path: Path) -> None:
    # A file that is not new (a new one gets the newest schema in one step,
    # `test_fresh_schema.py`): an empty `migrations` table, version 0.
    conn = sqlite3.connect(tmp_path / "q.db")
    conn.execute("CREATE TABLE migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
    conn.close()
    with capture_logs() as logs, Store.open(tmp_path / "q.db"):
        pass
    started = [e["to"] for e in logs if e["event"] == "schema_migrating"]
    done = [e for e in logs if e["event"] == "schema_migrated"]
    known = len(_schema.MIGRATIONS)
    assert started == list(range(1, known + 1))
    assert [e["version"] for e in done] == started
    assert all(e["backend"] == "sqlite" and e["elapsed_ms"] >= 0 for e in done)
    with capture_logs() as again, Store.open(tmp_path / "q.db"):
        pass  # up to date: nothing to say
    assert not [e for e in again if e["event"].startswith("schema_")]


def test_a_migration_over_many_rows_calls_progress_inside_its_statements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Version 10 builds three indexes over every job: one statement each, which on a big
    # database outlasts the supervisor's `ready_timeout_ms`; the writer beats through it.
    with monkeypatch.context() as m:
        m.setattr(_schema, "MIGRATIONS", _schema.MIGRATIONS[: _schema.SEQ_VERSION - 1])
        with Store.open(tmp_path / "q.db") as old:
            for start in range(0, 60_000, 10_000):
                old.apply([("put", _job(n)) for n in range(start, start + 10_000)])
    beats = 0

    def beat() -> None:
        nonlocal beats
        beats += 1

    with Store.open(tmp_path / "q.db", progress=beat) as store:
        assert store.schema_version == len(_schema.MIGRATIONS)
        after = beats
        assert len(list(store.load_jobs())) == 60_000
    assert after >= 3 and beats == after  # during the migration only, not after it


def _job(n: int) -> dict[str, Any]:
    return {"id": f"j{n}", "queue": "q", "state": "waiting", "seq": n, "data": {"n": n}}


def test_filling_made_beats_logs_progress_and_fills_every_cold_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Version 11 decodes every cold row once to fill `made` (`_schema.backfill_made`): the
    # writer beats through it and it logs its progress, and every cold row gets its record's
    # creation time (a hot one none).
    total = 2 * _schema.BACKFILL_CHUNK * 50 + 10  # two progress lines
    with monkeypatch.context() as m:
        m.setattr(_schema, "MIGRATIONS", _schema.MIGRATIONS[: _schema.MADE_VERSION - 1])
        with Store.open(tmp_path / "q.db") as old:
            for start in range(0, total, 20_000):
                rows = range(start, min(start + 20_000, total))
                old.apply([("put", {**_job(n), "cold": 1, "createdAt": 7 * n}) for n in rows])
            old.apply([("put", {**_job(total), "createdAt": 5})])
    beats = 0

    def beat() -> None:
        nonlocal beats
        beats += 1

    with capture_logs() as logs, Store.open(tmp_path / "q.db", progress=beat) as store:
        assert store.schema_version == len(_schema.MIGRATIONS)
        rows = store._conn.execute("SELECT made, seq, cold FROM jobs ORDER BY seq").fetchall()
    assert rows == [(7 * n, n, 1) for n in range(total)] + [(None, total, None)]
    progress = [e["rows"] for e in logs if e["event"] == "schema_migration_progress"]
    assert progress == [_schema.BACKFILL_CHUNK * 50, 2 * _schema.BACKFILL_CHUNK * 50]
    assert beats >= 3
