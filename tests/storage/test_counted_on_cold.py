"""SQLite schema 14: the cold count triggers cost a hot row's put and update nothing.

The trigger that keeps `cold_counts` on an update fires only for an UPDATE whose SET names
`cold` (`_cold_count_table.SQLITE_ON_COLD`), so the writer's update of hot rows (a pull's,
an ack's) compiles without it, and its update of the rows it left (cold ones) sets `cold` to
keep it (`_write._HOT`). There is no insert trigger: a cold row is put with `cold` NULL and
then marked (`_write._MARK_COLD`), which the update trigger counts. The counts themselves
are checked by the storage contract (test_contract_cold_counts); here, what each statement
runs.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from shardq.storage import Store, _schema, _write

_STATE = ("state",)
_INSERT = "INSERT INTO jobs (id, queue, state, seq, rec) VALUES (?, ?, ?, ?, ?)"
_ROW: list[object] = ["a", "q", "waiting", 1, b"\x80"]
_ROWS = f"({', '.join('?' * _write.HOT_ROW)})"
_PUT: list[object] = ["a", "q", "waiting", 0, 0, 1, b"\x80", b""]


def _programs(conn: sqlite3.Connection, sql: str, params: list[object]) -> int:
    """How many trigger sub-programs `sql` runs (per row it changes)."""
    return sum(1 for row in conn.execute(f"EXPLAIN {sql}", params) if row[1] == "Program")


def test_a_hot_update_runs_no_trigger_and_a_cold_one_runs_the_count_trigger(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "s.db") as store:
        assert store.schema_version == _schema.COUNTED_ON_COLD_VERSION
        conn = store._conn
        shared_hot = _write._shared_sql(_STATE, _write._HOT).format(rows="?, ?")
        shared_cold = _write._shared_sql(_STATE, _write._COLD).format(rows="?, ?")
        own_hot = _write._update_sql(_STATE, _write._HOT).format(rows="(?, ?, ?)")
        own_cold = _write._update_sql(_STATE, _write._COLD).format(rows="(?, ?, ?)")
        params: list[object] = ["active", b"", "a", "b"]
        assert _programs(conn, shared_hot, params) == 0
        assert _programs(conn, shared_cold, params) == 1
        assert _programs(conn, own_hot, params[:3]) == 0
        assert _programs(conn, own_cold, params[:3]) == 1
        assert _programs(conn, _INSERT, _ROW) == 0  # no insert trigger
        # The put's ON CONFLICT branch sets `cold`: the update trigger, for a conflict only.
        assert _programs(conn, _write._UPSERT_JOB.format(rows=_ROWS), _PUT) == 1
        assert _programs(conn, _write._MARK_COLD.format(rows="?"), ["a"]) == 1


def test_the_schema_before_fired_a_trigger_on_every_put_and_update(tmp_path: Path) -> None:
    """What version 14 changed: at 13 a hot put and a hot update ran a trigger per row."""
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    _schema.configure(conn, synchronous="normal", max_bytes=None)
    db = _schema.database(conn)
    for migration in _schema.MIGRATIONS[: _schema.COUNTED_ON_COLD_VERSION - 1]:
        migration(db)
    shared_hot = _write._shared_sql(_STATE, _write._HOT).format(rows="?, ?")
    assert _programs(conn, shared_hot, ["active", b"", "a", "b"]) == 1
    assert _programs(conn, _INSERT, _ROW) == 1
    assert _programs(conn, _write._UPSERT_JOB.format(rows=_ROWS), _PUT) == 2
    conn.close()
