"""A new database file gets the newest schema from `_schema_fresh.py` in one step, and that
schema is exactly what every migration makes of an empty file (statements, rows, version)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from structlog.testing import capture_logs

from shardq.storage import Store, _schema, _schema_fresh


def _migrated_step_by_step(path: Path) -> None:
    """A file brought to the newest version by the migrations themselves: it holds the
    `migrations` table already, so it is not new and `migrate` runs every step."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
    assert _schema.migrate(conn) == len(_schema.MIGRATIONS)
    conn.close()


def _contents(path: Path) -> tuple[list[tuple[str, str, str, str | None]], list[object], list[int]]:
    conn = sqlite3.connect(path)
    master = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
    ).fetchall()
    meta = conn.execute("SELECT key, value FROM meta ORDER BY key").fetchall()
    versions = [v for (v,) in conn.execute("SELECT version FROM migrations ORDER BY version")]
    conn.close()
    return master, meta, versions


def _script_from(path: Path) -> str:
    conn = sqlite3.connect(path)
    statements = [s for (s,) in conn.execute(
        "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")]  # fmt: skip
    meta = conn.execute("SELECT key, value FROM meta ORDER BY rowid").fetchall()
    conn.close()
    lines = [f"VERSION: Final = {len(_schema.MIGRATIONS)}", "", "STATEMENTS = ("]
    lines += [f"    {s!r}," for s in statements] + [")", "", "META_ROWS = ("]
    lines += [f"    {row!r}," for row in meta] + [")"]
    return "\n".join(lines)


def test_a_new_file_gets_the_schema_the_migrations_make(tmp_path: Path) -> None:
    stepped, fresh = tmp_path / "stepped.db", tmp_path / "fresh.db"
    _migrated_step_by_step(stepped)
    assert len(_schema.MIGRATIONS) == _schema_fresh.VERSION, (
        "a migration was appended: make shardq/storage/_schema_fresh.py again:\n"
        + _script_from(stepped)
    )
    with capture_logs() as logs, Store.open(fresh) as store:
        assert store.schema_version == len(_schema.MIGRATIONS)
    assert _contents(fresh) == _contents(stepped), _script_from(stepped)
    events = [e["event"] for e in logs]
    assert "schema_migrating" not in events
    [created] = [e for e in logs if e["event"] == "schema_created"]
    assert created["version"] == len(_schema.MIGRATIONS)


def test_an_existing_file_still_migrates_step_by_step(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
    conn.close()
    with capture_logs() as logs, Store.open(path) as store:
        assert store.schema_version == len(_schema.MIGRATIONS)
    started = [e["to"] for e in logs if e["event"] == "schema_migrating"]
    assert started == list(range(1, len(_schema.MIGRATIONS) + 1))
    assert not any(e["event"] == "schema_created" for e in logs)
