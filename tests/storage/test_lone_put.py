"""A batch of one encoded put is written by its one statement with no transaction around it
(`Store._apply_lone_put`): it must be committed when `apply` returns, and a failure must leave
the file as it was and the store usable, as a transaction would."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from storage_records import job

from shardq.storage import MutationEncoder, StorageFull, Store


def putb(job_id: str, seq: int, **extra: object) -> tuple[object, ...]:
    (mutation,) = MutationEncoder().encode([("put", job(job_id, seq=seq, **extra))])
    assert mutation[0] == "putb"
    return tuple(mutation)


def test_a_lone_put_is_committed_when_apply_returns(tmp_path: Path) -> None:
    path = tmp_path / "shardq.db"
    with Store.open(path) as store:
        for n in range(1, 4):
            assert store.apply([putb(f"j{n}", n)]) == 1
            # Another connection, with this store still open: it reads committed rows only.
            with sqlite3.connect(path) as other:
                rows = other.execute("SELECT id FROM jobs ORDER BY seq").fetchall()
            assert rows == [(f"j{k}",) for k in range(1, n + 1)]
        assert store.get_job("j2") == job("j2", seq=2)
        store.apply([("upd", "j2", {"state": "active"})])  # the row summary it learned
        assert store.get_job("j2") == job("j2", seq=2, state="active")


def test_a_lone_put_that_fails_leaves_the_file_and_the_store_as_they_were(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shardq.db"
    blob = bytes(range(256)) * 16  # 4 KiB per record: one overflow page each
    committed: list[str] = []
    with Store.open(path, max_bytes=256 * 1024) as store:
        with pytest.raises(StorageFull, match="full"):
            for n in range(1, 200):
                store.apply([putb(f"j{n}", n, blob=blob)])
                committed.append(f"j{n}")
        assert committed, "the cap should allow a few puts first"
        assert [r["id"] for r in store.load_jobs()] == committed
        store.apply([("del", committed[0])])  # the store goes on: no transaction was left open
        store.apply([putb("small", 999)])
    with Store.open(path) as again:
        assert [r["id"] for r in again.load_jobs()] == [*committed[1:], "small"]


def _rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT * FROM jobs ORDER BY id").fetchall()


def test_a_lone_put_stores_the_row_a_batch_of_several_puts_stores(tmp_path: Path) -> None:
    # Each batch of the lone store is one encoded put (`_lone`); the other store gets every
    # put with a second job's put beside it, which takes the general path (`coalesce`,
    # `write_plan`). Their rows must be the same, column for column: a put over a hot row
    # with a patch, over a cold row, and a fresh one.
    cold = {"cold": 1, "lifo": True, "gid": "g", "ukey": "u"}
    steps: list[list[tuple[object, ...]]] = [
        [putb("a", 1)],
        [("upd", "a", {"state": "active"})],  # a patch for the next put to drop
        [putb("a", 2, data={"again": True}, priority=5)],
        [putb("c", 3, **cold), putb("d", 4, **cold)],  # cold rows (the general path)
        [putb("c", 5)],  # a hot put over a cold row: its cold columns go back to NULL
        [putb("b", 6, attempts=2, runAt=1_800_000_000_000)],
    ]
    lone, general = tmp_path / "lone.db", tmp_path / "general.db"
    with Store.open(lone) as one, Store.open(general) as many:
        for n, batch in enumerate(steps):
            written = one.apply(batch)
            pad = [putb(f"pad{n}", 100 + n)] if batch[0][0] == "putb" else []
            assert many.apply(batch + pad) == written + len(pad)
            many.apply([("del", f"pad{n}")] if pad else [])
        # What the lone puts taught the row cache: an update of each job finds it.
        for store in (one, many):
            store.apply([("upd", "a", {"state": "failed"}), ("upd", "c", {"priority": 9})])
        assert one.skipped_updates == many.skipped_updates == 0
    stored = _rows(lone)
    assert stored == _rows(general)
    assert {r[0] for r in stored} == {"a", "b", "c", "d"}


def test_lone_durable_put_writes_no_transaction_statements(tmp_path: Path) -> None:
    # The lone path is one statement, nothing around it (SQLite's trace of the connection).
    path = tmp_path / "shardq.db"
    with Store.open(path) as store:
        store.apply([putb("warm", 1)])
        seen: list[str] = []
        store._conn.set_trace_callback(seen.append)
        store.apply([putb("a", 2)])
        store._conn.set_trace_callback(None)
    assert len(seen) == 1 and seen[0].startswith("INSERT INTO jobs"), seen
