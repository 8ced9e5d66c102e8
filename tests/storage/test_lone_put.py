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
