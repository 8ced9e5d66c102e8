"""SQLite schema 14: the cold count triggers cost a hot row's put and update nothing.

The trigger that keeps `cold_counts` on an update fires only for an UPDATE whose SET names
`cold` (`_cold_count_table.SQLITE_ON_COLD`), so the writer's update of hot rows (a pull's,
an ack's) compiles without it, and its update of the rows it left (cold ones) sets `cold` to
keep it (`_write_updates.HOT`). There is no insert trigger: a cold row is put with `cold` NULL and
then marked (`_write_puts._MARK_COLD`), which the update trigger counts. The counts themselves
are checked by the storage contract (test_contract_cold_counts); here, what each statement
runs.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sqlite3
from pathlib import Path

import shardq.storage
from shardq.storage import Store, _schema, _write_puts, _write_updates

_STATE = ("state",)
_INSERT = "INSERT INTO jobs (id, queue, state, seq, rec) VALUES (?, ?, ?, ?, ?)"
_ROW: list[object] = ["a", "q", "waiting", 1, b"\x80"]
_ROWS = f"({', '.join('?' * _write_puts.HOT_ROW)})"
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
        shared_hot = _write_updates._shared_sql(_STATE, _write_updates.HOT).format(rows="?, ?")
        shared_cold = _write_updates._shared_sql(_STATE, _write_updates.COLD).format(rows="?, ?")
        own_hot = _write_updates._update_sql(_STATE, _write_updates.HOT).format(rows="(?, ?, ?)")
        own_cold = _write_updates._update_sql(_STATE, _write_updates.COLD).format(rows="(?, ?, ?)")
        params: list[object] = ["active", b"", "a", "b"]
        assert _programs(conn, shared_hot, params) == 0
        assert _programs(conn, shared_cold, params) == 1
        assert _programs(conn, own_hot, params[:3]) == 0
        assert _programs(conn, own_cold, params[:3]) == 1
        assert _programs(conn, _INSERT, _ROW) == 0  # no insert trigger
        # The put's ON CONFLICT branch sets `cold`: the update trigger, for a conflict only.
        assert _programs(conn, _write_puts._UPSERT_JOB.format(rows=_ROWS), _PUT) == 1
        assert _programs(conn, _write_puts._MARK_COLD.format(rows="?"), ["a"]) == 1


def test_the_schema_before_fired_a_trigger_on_every_put_and_update(tmp_path: Path) -> None:
    """What version 14 changed: at 13 a hot put and a hot update ran a trigger per row."""
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    _schema.configure(conn, synchronous="normal", max_bytes=None)
    db = _schema.database(conn)
    for migration in _schema.MIGRATIONS[: _schema.COUNTED_ON_COLD_VERSION - 1]:
        migration(db)
    shared_hot = _write_updates._shared_sql(_STATE, _write_updates.HOT).format(rows="?, ?")
    assert _programs(conn, shared_hot, ["active", b"", "a", "b"]) == 1
    assert _programs(conn, _INSERT, _ROW) == 1
    assert _programs(conn, _write_puts._UPSERT_JOB.format(rows=_ROWS), _PUT) == 2
    conn.close()


# The columns of a `cold_counts` key a statement can change (`_cold_count_table`); `cold`
# itself and `made`, `lifo`, `ukey`, `rec`, `patch`, `run_at`, `seq` are no part of it.
_KEY_COLUMNS = {"queue", "state", "priority", "gid"}


def _set_columns(sql: str) -> set[str]:
    """The columns the SET of an UPDATE (or an upsert's DO UPDATE) assigns."""
    sets = re.split(r"\bSET\b", sql, maxsplit=1)[1]
    sets = re.split(r"\b(?:WHERE|FROM)\b", sets, maxsplit=1)[0]
    return {m.group(1) for m in re.finditer(r"(?:^|,)\s*(\w+)\s*=", sets)}


def _writes_of_jobs() -> dict[str, str]:
    """Every statement text of the SQLite storage modules that updates rows of `jobs`, by
    where it comes from, with the writer's generated updates of each kind."""
    found: dict[str, str] = {}
    for module in pkgutil.iter_modules(shardq.storage.__path__):
        if "pg" in module.name or "postgres" in module.name:
            continue  # PostgreSQL's triggers fire on every update of the key's columns
        loaded = importlib.import_module(f"shardq.storage.{module.name}")
        for name, value in vars(loaded).items():
            texts = value if isinstance(value, tuple) else (value,)
            for i, text in enumerate(texts):
                if isinstance(text, str) and (
                    re.search(r"\bUPDATE\s+jobs\b", text)
                    or re.search(r"\bINSERT INTO jobs\b.*\bDO UPDATE SET\b", text, re.S)
                ):
                    found[f"{module.name}.{name}[{i}]"] = text
    for names in (_STATE, ("queue", "state", "priority", "runAt", "seq")):
        for variant in ("", _write_updates.HOT, _write_updates.COLD):
            found[f"_update_sql{names}{variant}"] = _write_updates._update_sql(names, variant)
            found[f"_shared_sql{names}{variant}"] = _write_updates._shared_sql(names, variant)
    return found


def test_every_update_of_a_counted_column_sets_cold_or_is_for_hot_rows_only() -> None:
    # Schema 14's rule (`_write_updates.HOT`): the count trigger fires only for an UPDATE that sets
    # `cold`, so one that can change a cold row's queue, state, group or priority must set
    # `cold` (if only to itself), or touch hot rows only (`cold IS NULL`). A new statement
    # that does neither would let the counts drift; it fails here.
    statements = _writes_of_jobs()
    assert "_write_puts._MARK_COLD[0]" in statements and "_write_puts._UPSERT_JOB[0]" in statements
    # Exempt: the tables older than the cold columns have no counts at all (tests build them),
    # and the unconditional variant of the generated updates serves only those tables.
    # The plain upsert is exempt wherever it is used, with any number of rows (`_lone`'s is
    # the template formatted for one).
    head, tail = _write_puts._UPSERT_PLAIN_JOB.split("{rows}")
    plain = {k for k, sql in statements.items() if sql.startswith(head) and sql.endswith(tail)}
    assert "_write_puts._UPSERT_PLAIN_JOB[0]" in plain and "_lone._UPSERT_PLAIN[0]" in plain
    exempt = {*plain, *(k for k in statements if k.endswith(")"))}
    wrong = {
        where: sql
        for where, sql in statements.items()
        if where not in exempt
        and _set_columns(sql) & _KEY_COLUMNS
        and "cold" not in _set_columns(sql)
        and "cold IS NULL" not in sql
    }
    assert wrong == {}
