"""What the PostgreSQL store adds to the storage contract (tests/storage/contract/ runs the
contract itself on it): its error mapping, reconnecting after a lost connection, concurrent
openers, exact row counts through the pipeline, and the message when psycopg is missing.

Runs against the real test server (`pg_server`); deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from typing import Any

import msgpack  # type: ignore[import-untyped]
import psycopg
import pytest
from pg_server import shared_server

from shardq.core._mutations import Mutation
from shardq.core._record import fill_record
from shardq.storage import (
    StorageError,
    StorageFenced,
    StorageRejected,
    Store,
    _drain_pending,
    open_postgres,
)
from shardq.storage._pg_fence import Fence
from shardq.storage._pg_schema import MIGRATIONS
from shardq.storage._postgres import PostgresStore

NEEDS_POSTGRES = True


def _job(job_id: str, seq: int = 1, **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": job_id, "queue": "qa", "state": "waiting", "seq": seq}
    rec.update(priority=0, runAt=1_700_000_000_000, data={"n": seq})
    rec.update(extra)
    return fill_record(rec)  # as a store reads it back (the defaults put back)


def _putb(rec: dict[str, Any], run_at: int) -> Mutation:
    """A put as a shard encodes it, its run_at column set apart from the record."""
    packed = msgpack.packb(rec, use_bin_type=True)
    return ("putb", rec["id"], rec["queue"], rec["state"], 0, run_at, rec["seq"], packed)


@pytest.fixture
def store() -> Any:
    with open_postgres(shared_server().url(), schema=f"t_{uuid.uuid4().hex[:12]}") as s:
        yield s


def test_a_value_postgresql_refuses_is_rejected_and_the_store_stays_usable(
    store: PostgresStore,
) -> None:
    store.apply([("put", _job("a"))])
    # PostgreSQL's text holds no NUL and its bigint no 2**70: the batch is at fault (the
    # writer bisects it), not the server.
    for bad in (_putb(_job("nul\x00id", seq=2), 1), _putb(_job("b", seq=3), 1 << 70)):
        with pytest.raises(StorageRejected):
            store.apply([("put", _job("c", seq=4)), ("upd", "a", {"state": "active"}), bad])
    assert [r["id"] for r in store.load_jobs()] == ["a"]
    assert store.get_job("a") == _job("a")
    store.apply([("put", _job("c", seq=4)), ("upd", "a", {"state": "active"})])
    assert [r["state"] for r in store.load_jobs()] == ["active", "waiting"]


def test_a_lost_connection_is_transient_and_the_next_apply_reconnects(
    store: PostgresStore,
) -> None:
    store.apply([("put", _job("a"))])
    pid = store._conn.info.backend_pid
    with psycopg.connect(shared_server().url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    batch: list[Mutation] = [("put", _job("b", seq=2)), ("upd", "a", {"state": "active"})]
    with pytest.raises(StorageError) as lost:
        store.apply(batch)
    assert not isinstance(lost.value, StorageRejected)  # the writer keeps it and retries
    assert store.apply(batch) >= 2  # the retry, on a new connection
    assert [(r["id"], r["state"]) for r in store.load_jobs()] == [("a", "active"), ("b", "waiting")]


def _fenced_with_a_range(store: PostgresStore) -> list[dict[int, int]]:
    """`store` as a node holding every one of 4 partitions (by its fence; the lease table has
    no row), with a Drain range of queue qa pending: the fence's `held()` mapping is the
    list's one item (replaced whole, as the lease thread does)."""
    store._conn.execute("INSERT INTO drain_pending VALUES ('qa', NULL, 5)")
    held = [{p: 1 for p in range(4)}]
    store.fence = Fence("node-t", 4, lambda: held[0])
    return held


def test_a_lost_connection_while_the_pending_drains_are_read_again_is_a_storage_error(
    store: PostgresStore,
) -> None:
    """The writer's drain pieces catch `StorageError` (`writer._drain_pieces`): the ranges
    read again after a change of partitions must fail as one, and reconnect after."""
    held = _fenced_with_a_range(store)
    assert store.pending_drains == {"qa": 5}
    pid = store._conn.info.backend_pid
    with psycopg.connect(shared_server().url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    held[0] = dict(held[0])  # the partitions changed: the ranges are read again
    with pytest.raises(StorageError):
        store.pending_drains  # noqa: B018
    assert store.pending_drains == {"qa": 5}  # on a new connection


def test_a_drain_piece_of_a_partition_no_longer_held_is_fenced(store: PostgresStore) -> None:
    """A piece is fenced as a batch is: the database says the partition moved (here: no
    lease row names this node), and the piece raises `StorageFenced`, deleting nothing."""
    _fenced_with_a_range(store)
    with pytest.raises(StorageFenced):
        store.drain_step(10)
    assert store.pending_drains == {"qa": 5}


def test_a_failed_read_of_the_pending_drains_at_open_is_a_storage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Opening reads the pending Drain ranges after the migration: a connection lost there
    fails the open as a `StorageError`, as one lost during the migration does."""

    def lost(conn: Any) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(_drain_pending, "load", lost)
    with pytest.raises(StorageError, match="opening"):
        open_postgres(shared_server().url(), schema=f"t_{uuid.uuid4().hex[:12]}")


def test_rows_written_are_counted_as_the_sqlite_store_counts_them(
    store: PostgresStore, tmp_path: Any
) -> None:
    batches: list[list[Mutation]] = [
        [("put", _job(f"j{n}", seq=n)) for n in range(5)] + [("queue", "qa", {"paused": True})],
        [("upd", f"j{n}", {"state": "active"}) for n in range(3)] + [("del", "j4"), ("del", "x")],
        [("qdel", "qa"), ("cron", "c", {"name": "c", "queue": "qb"}), ("webhook", "w", {})],
    ]
    with Store.open(tmp_path / "same.db") as sqlite:
        for batch in batches:
            assert store.apply(batch) == sqlite.apply(batch)


def test_concurrent_openers_of_a_new_schema_migrate_it_once() -> None:
    url, schema = shared_server().url(), f"t_{uuid.uuid4().hex[:12]}"
    versions: list[int] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            with PostgresStore.open(url, schema=schema) as s:
                versions.append(s.schema_version)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and versions == [len(MIGRATIONS)] * 4
    with psycopg.connect(url) as conn:
        rows = conn.execute(f'SELECT version FROM "{schema}".migrations ORDER BY 1').fetchall()
    assert [v for (v,) in rows] == list(range(1, len(MIGRATIONS) + 1))


def test_an_unreachable_server_is_a_storage_error_without_the_password() -> None:
    # Port 1 of the loopback: nothing listens there, the connection is refused at once.
    url = "postgresql://someone:s3cret-pw@127.0.0.1:1/db?connect_timeout=5"
    with pytest.raises(StorageError, match="cannot connect") as failed:
        PostgresStore.open(url)
    assert "s3cret-pw" not in str(failed.value)


def test_a_missing_psycopg_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from shardq.storage import StorageError, open_postgres\n"
        "try:\n"
        "    open_postgres('postgresql://127.0.0.1/x')\n"
        "except StorageError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == (
        "PostgreSQL storage needs psycopg: pip install 'shardq[postgres]'"
    ), done.stderr


def test_numbers_of_mixed_types_in_one_column_are_stored(store: PostgresStore) -> None:
    # One batch's rows go to the server as one array per column, which holds one type: an
    # int and a float priority (or run_at) side by side must still go in.
    store.apply([("put", _job("a", priority=1)), ("put", _job("b", seq=2, priority=2.5))])
    store.apply([("put", _job("c", seq=3, runAt=1.7e12)), ("put", _job("d", seq=4))])
    store.apply([("upd", "a", {"priority": 0.5, "runAt": 5.0}), ("upd", "b", {"priority": 3})])
    assert [r["priority"] for r in store.load_jobs()] == [0.5, 3, 0, 0]
    assert store.get_job("c") == _job("c", seq=3, runAt=1.7e12)


def test_without_postgresql_binaries_the_tests_fail_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No pg_config on the PATH and nothing under /usr/lib/postgresql: the fixture raises (so
    # the tests fail, never skip), naming the package and the opt-out.
    from bench import _pg_server

    monkeypatch.setattr(_pg_server.shutil, "which", lambda name: None)
    monkeypatch.setattr(_pg_server.glob, "glob", lambda pattern: [])
    with pytest.raises(RuntimeError, match="`postgresql` package") as missing:
        _pg_server.PostgresServer()
    assert "SHARDQ_TEST_POSTGRES=0" in str(missing.value)
