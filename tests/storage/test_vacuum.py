"""Giving free pages back (`shardq.storage._vacuum`), against real SQLite files.

- A new database is made in incremental auto_vacuum mode; `release_pages` frees at most the
  pages asked, shrinks the file, and keeps every row that is left.
- An old database (auto_vacuum NONE, as shardq made them before) frees nothing until
  `convert_to_incremental` has rewritten it, which keeps every row.
- A conversion that cannot run (too little free disk) or that SQLite refuses leaves the file
  exactly as it was; one interrupted at any moment leaves it whole, converted or not.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from storage_records import job

from shardq.storage import StorageError, Store, _vacuum

JOBS = 2000
PAD = "x" * 1000


def fill(store: Store, jobs: int = JOBS) -> None:
    store.apply([("put", job(f"j{n}", seq=n + 1, data={"pad": PAD})) for n in range(jobs)])


def keep_every_tenth(store: Store, jobs: int = JOBS) -> list[str]:
    """Delete nine jobs in ten (the survivors are spread over the file); return the rest."""
    store.apply([("del", f"j{n}") for n in range(jobs) if n % 10])
    return [f"j{n}" for n in range(0, jobs, 10)]


def stored_ids(store: Store) -> list[str]:
    return sorted(rec["id"] for rec in store.load_jobs())


def make_old(path: Path) -> None:
    """Turn a shardq database into the way earlier versions made it: auto_vacuum NONE."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("PRAGMA auto_vacuum = NONE; VACUUM; PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def test_a_new_database_gives_free_pages_back_a_step_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with Store.open(path) as store:
        assert store.auto_vacuum == "incremental"
        assert store.pragmas()["auto_vacuum"] == 2
        fill(store)
        left = keep_every_tenth(store)
        store.checkpoint()
        full = path.stat().st_size
        free = store.free_pages()
        assert free * 4096 > full // 2  # most of the file is free
        assert store.release_pages(16) == 16  # no more than asked
        assert store.free_pages() == free - 16
        while store.release_pages(256):
            pass
        assert store.free_pages() == 0
        store.checkpoint()
        assert path.stat().st_size < full // 3
        assert stored_ids(store) == sorted(left)
        assert all(rec["data"] == {"pad": PAD} for rec in store.load_jobs())


def test_an_old_database_frees_nothing_until_converted_and_loses_no_row(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with Store.open(path) as store:
        fill(store)
    make_old(path)
    with Store.open(path) as store:  # opening an old file converts nothing by itself
        assert store.auto_vacuum == "none"
        left = keep_every_tenth(store)
        free = store.free_pages()
        assert free > 0
        assert store.release_pages(256) == 0  # incremental vacuum is a no-op on it
        assert store.free_pages() == free
        store.convert_to_incremental()
        assert store.auto_vacuum == "incremental"
        assert store.pragmas()["temp_store"] == 2  # put back to MEMORY after the VACUUM
        assert store.free_pages() == 0  # the VACUUM itself dropped the free pages
        assert stored_ids(store) == sorted(left)
        # Incremental from now on: pages freed by later deletes go back a step at a time.
        store.apply([("del", key) for key in left[: len(left) // 2]])
        assert store.free_pages() > 0
        assert store.release_pages(10_000) > 0 and store.free_pages() == 0
        assert stored_ids(store) == sorted(left[len(left) // 2 :])


def test_a_conversion_without_the_disk_it_needs_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    with Store.open(path) as store:
        fill(store)
    make_old(path)
    before = path.read_bytes()

    def little_free(where: Any) -> Any:
        return shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000)  # type: ignore[attr-defined]

    monkeypatch.setattr(_vacuum.shutil, "disk_usage", little_free)
    with Store.open(path) as store:
        with pytest.raises(StorageError, match=r"needs about \d+ bytes free"):
            store.convert_to_incremental()
        assert store.auto_vacuum == "none"
        assert len(stored_ids(store)) == JOBS
    assert path.read_bytes() == before


def test_a_conversion_sqlite_refuses_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with Store.open(path) as store:
        fill(store)
    make_old(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        reading = conn.execute("SELECT id FROM jobs")
        reading.fetchone()  # a statement in progress: SQLite refuses to VACUUM
        with pytest.raises(StorageError, match=r"converting .* statements in progress"):
            _vacuum.convert(conn, path)
        reading.close()
        assert _vacuum.auto_vacuum(conn) == "none"
        assert conn.execute("PRAGMA temp_store").fetchone()[0] == 0  # put back as it was
    finally:
        conn.close()
    with Store.open(path) as store:
        assert store.auto_vacuum == "none"
        assert stored_ids(store) == sorted(f"j{n}" for n in range(JOBS))
        store.apply([("del", "j0")])  # and the store still works
        assert len(stored_ids(store)) == JOBS - 1


def test_an_interrupted_conversion_loses_nothing_whenever_it_stops(tmp_path: Path) -> None:
    """A progress report that fails interrupts the VACUUM, unless it is past the phases SQLite
    checks for an interruption: either way the file is whole, converted or as it was."""
    path = tmp_path / "old.db"
    with Store.open(path) as store:
        fill(store)
    make_old(path)

    def interrupt(elapsed_s: float) -> None:
        raise RuntimeError("the supervisor is gone")

    conn = sqlite3.connect(path, isolation_level=None)
    try:
        _vacuum.convert(conn, path, interrupt, every_s=0.001)
    except StorageError as e:
        assert "interrupted" in str(e)
        assert _vacuum.auto_vacuum(conn) == "none"
    else:
        assert _vacuum.auto_vacuum(conn) == "incremental"
    finally:
        conn.close()
    with Store.open(path) as store:
        assert stored_ids(store) == sorted(f"j{n}" for n in range(JOBS))
        assert all(rec["data"] == {"pad": PAD} for rec in store.load_jobs())
