"""Opening a store says what its migrations do: a long one must not look like a hung server."""

from __future__ import annotations

from pathlib import Path

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
