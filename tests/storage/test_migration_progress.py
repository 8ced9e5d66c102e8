"""Opening a store says what its migrations do: a long one must not look like a hung server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shardq.storage import _schema
from shardq.storage._store import Store


def test_each_migration_step_is_logged_with_its_time(tmp_path: Path) -> None:
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
