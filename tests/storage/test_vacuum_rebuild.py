"""Rebuilding a mostly free file and swapping it in (`shardq.storage._rebuild`,
`Store.swap_in`), against real SQLite files.

- The copy `VACUUM INTO` makes on a second connection while the store keeps committing holds
  its snapshot; swapped in, the store serves the compact file in WAL mode and incremental
  auto_vacuum, with every row.
- A backup's connection (the shared swap lock) keeps the swap from happening; it is then a
  no-op, and succeeds once the backup is gone. So does a shard's store (`open_storage` for a
  reader), from its opening to its close.
- A process killed at each point of the swap (before the rename, after it, after the
  directory's fsync) leaves a whole database holding every row, old file or new.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from storage_records import job

from shardq.runtime._spec import ChildSpec
from shardq.runtime._storage import open_storage
from shardq.storage import Store
from shardq.storage._rebuild import (
    copy_into,
    open_copier,
    rebuild_path,
    remove_leftover,
    swap_guard,
)

JOBS = 3000
PAD = "x" * 1000


def mostly_free(path: Path) -> Store:
    """A store of `JOBS` jobs of which all but every tenth were deleted."""
    store = Store.open(path)
    store.apply([("put", job(f"j{n}", seq=n + 1, data={"pad": PAD})) for n in range(JOBS)])
    store.apply([("del", f"j{n}") for n in range(JOBS) if n % 10])
    store.checkpoint()
    return store


def kept() -> list[str]:
    return sorted(f"j{n}" for n in range(0, JOBS, 10))


def ids(store: Store) -> list[str]:
    return sorted(rec["id"] for rec in store.load_jobs())


def copy_of(path: Path) -> Path:
    conn = open_copier(path)
    try:
        assert copy_into(conn, rebuild_path(path)) > 0
    finally:
        conn.close()
    return rebuild_path(path)


def test_a_rebuilt_copy_is_swapped_in_compact_and_whole(tmp_path: Path) -> None:
    path = tmp_path / "shardq.db"
    with mostly_free(path) as store:
        pages, free, _size = store.page_counts()
        assert free * 2 > pages
        before = path.stat().st_size
        mark = store.change_mark()
        copy = copy_of(path)
        assert store.change_mark() == mark  # the copy wrote nothing to the store
        assert store.swap_in(copy)
        assert not copy.exists()
        assert path.stat().st_size < before // 3
        assert store.page_counts()[1] == 0
        assert store.auto_vacuum == "incremental"
        assert store.pragmas()["journal_mode"] == "wal"
        assert ids(store) == kept()
        assert store.change_mark() == mark  # the swap wrote nothing
        store.apply([("put", job("after", seq=JOBS + 1, data={"pad": PAD}))])
        assert store.change_mark() > mark
        assert ids(store) == sorted([*kept(), "after"])
        mark = store.change_mark()
        store.release_memory()  # a new connection: the mark goes on
        assert store.change_mark() == mark
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_copy_holds_its_snapshot_while_the_store_commits(tmp_path: Path) -> None:
    path = tmp_path / "shardq.db"
    with mostly_free(path) as store:
        conn = open_copier(path)
        conn.execute("BEGIN")
        before = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]  # a read snapshot
        mark = store.change_mark()
        store.apply([("put", job("late", seq=JOBS + 1, data={}))])  # not blocked by it
        assert store.change_mark() != mark  # the writer would drop a copy made meanwhile
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == before
        conn.execute("COMMIT")
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == before + 1
        conn.close()


def test_a_backup_connection_keeps_the_swap_off(tmp_path: Path) -> None:
    path = tmp_path / "shardq.db"
    with mostly_free(path) as store:
        copy = copy_of(path)
        with swap_guard(path, exclusive=False) as shared:
            assert shared
            assert not store.swap_in(copy)  # nothing happened
            assert copy.exists()
            assert ids(store) == kept()
        assert store.swap_in(copy)
        assert ids(store) == kept()


def test_a_shards_store_keeps_the_swap_off_while_it_is_open(tmp_path: Path) -> None:
    # Renamed over under a shard's connection (its load at start-up), the file left the
    # shard reading a malformed schema through the shared -wal and -shm names.
    path = tmp_path / "shardq.db"
    spec = ChildSpec(role="shard", run_dir=str(tmp_path), data_path=str(path), shards=1)
    with mostly_free(path) as store:
        copy = copy_of(path)
        reader = open_storage(spec, capped=False)
        assert sorted(rec["id"] for rec in reader.load_jobs()) == kept()
        assert not store.swap_in(copy)  # nothing happened
        assert copy.exists() and ids(store) == kept()
        reader.close()
        assert store.swap_in(copy)
        assert ids(store) == kept()
        again = open_storage(spec, capped=False)  # opens the new file, and locks again
        assert sorted(rec["id"] for rec in again.load_jobs()) == kept()
        assert not store.swap_in(copy_of(path))
        again.close()


def test_a_leftover_copy_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "shardq.db"
    with mostly_free(path):
        copy_of(path)
    assert remove_leftover(path) == [rebuild_path(path).name]
    assert not rebuild_path(path).exists()


_SWAP_AND_DIE = """
import os, signal, sys
from pathlib import Path
from shardq.runtime._spec import ChildSpec
from shardq.runtime._storage import open_storage
from shardq.storage import Store
from shardq.storage import _rebuild, _store_file

path, copy, point = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point == "before-rename":
    _store_file.os.replace = lambda *a: die()  # the process dies where the rename would be
elif point == "after-rename":
    _rebuild.fsync_directory = lambda *a: die()
elif point == "before-reopen":
    real_fsync = _rebuild.fsync_directory
    def fsync_then_die(p):
        real_fsync(p)
        die()
    _rebuild.fsync_directory = fsync_then_die
store = Store.open(path)
store.swap_in(copy)
"""


@pytest.mark.parametrize("point", ["before-rename", "after-rename", "before-reopen"])
def test_a_process_killed_during_the_swap_leaves_a_whole_database(
    tmp_path: Path, point: str
) -> None:
    path = tmp_path / "shardq.db"
    with mostly_free(path):
        pass
    copy = copy_of(path)
    child = subprocess.run(
        [sys.executable, "-c", _SWAP_AND_DIE, str(path), str(copy), point],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    assert copy.exists() == (point == "before-rename")
    remove_leftover(path)  # what the next writer does first
    with Store.open(path) as store:
        assert ids(store) == kept()
        assert store.auto_vacuum == "incremental"
        if point != "before-rename":
            assert store.page_counts()[1] == 0  # the new file
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert os.path.exists(path)
