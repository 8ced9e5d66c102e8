"""Durability gaps: what survives when the pieces between an answer and the disk break.

- A worker dropped with completions still in its client-side ACK buffer (it ran the jobs but
  its ACKB never went out): those jobs are redelivered, uncharged, and complete exactly once.
- A WAL truncated, or given a garbage header, between runs (after a `kill -9` left it
  un-checkpointed): the server starts, from a committed prefix of the durable pushes in the
  order they were answered, with no phantom job, and takes new work.
- A corrupt main database: `shardq start` refuses with an explicit message and a non-zero exit
  in bounded time, never a wedge.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from shardq_harness import ShardqServer

from shardq.client import TcpConnection

PUSHES = int(os.environ.get("SHARDQ_ADVERSARIAL_PUSHES", "120"))
TIMEOUT_S = 15.0
REFUSAL_S = 30.0  # a refusal must come within this; longer is a wedge


def call(c: TcpConnection, **cmd: Any) -> dict[str, Any]:
    return c.call(cmd, check=False)


def all_ids(server: ShardqServer, queue: str) -> list[str]:
    with TcpConnection(*server.tcp_address, timeout=TIMEOUT_S) as c:
        reply = call(c, cmd="GetJobs", queue=queue, limit=PUSHES + 100)
    assert reply["ok"], reply
    return [j["id"] for j in reply["jobs"]]


def test_completions_in_a_dropped_ack_buffer_run_again_exactly_once(tmp_path: Path) -> None:
    with ShardqServer(tmp_path / "data", shards=2).start() as server:
        with TcpConnection(*server.tcp_address) as c:
            ids = call(c, cmd="PUSHB", queue="ackbuf", jobs=[{"data": i} for i in range(10)])["ids"]
        dying = TcpConnection(*server.tcp_address)
        ran = call(dying, cmd="PULLB", queue="ackbuf", count=10, owner="dying")["jobs"]
        assert len(ran) == 10
        dying.close()  # its handlers finished; the buffered ACKB is never sent
        delivered: list[str] = []
        with TcpConnection(*server.tcp_address) as c:
            for _ in range(50):
                got = call(c, cmd="PULLB", queue="ackbuf", count=10, owner="next", timeout=200)
                if got["jobs"]:
                    assert all(j["attempts"] == 0 for j in got["jobs"])
                    batch = [j["id"] for j in got["jobs"]]
                    assert call(c, cmd="ACKB", ids=batch, tokens=got["tokens"])["ok"]
                    delivered += batch
                if len(delivered) >= 10:
                    break
            assert call(c, cmd="PULLB", queue="ackbuf", count=10, owner="next")["jobs"] == []
            counts = call(c, cmd="GetJobCounts", queue="ackbuf")["counts"]
        assert sorted(delivered) == sorted(ids)  # each once: no loss, no duplicate
        assert counts["completed"] == 10 and counts["waiting"] == counts["active"] == 0


def _durable_run_then_kill(data: Path) -> list[str]:
    """One shard; PUSHES durable pushes, one at a time (so each answer follows its own
    commit); then `kill -9` of the tree, leaving the WAL as it was. The ids in answer order."""
    server = ShardqServer(data, shards=1).start()
    try:
        ids: list[str] = []
        with TcpConnection(*server.tcp_address) as c:
            for i in range(PUSHES):
                reply = call(c, cmd="PUSH", queue="wal", data={"i": i}, durable=True)
                assert reply["ok"], reply
                ids.append(reply["id"])
        server.kill9_tree()
    finally:
        server.close()
    return ids


def _truncate_half(wal: Path) -> None:
    os.truncate(wal, wal.stat().st_size // 2)


def _garbage_header(wal: Path) -> None:
    with wal.open("r+b") as f:
        f.write(b"\xde\xad\xbe\xef" * 8)  # the 32-byte WAL header


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """One killed run shared by the damage cases (each damages its own copy): a start costs
    seconds on a loaded machine."""
    data = tmp_path_factory.mktemp("killed") / "data"
    return data, _durable_run_then_kill(data)


@pytest.fixture(scope="module")
def clean_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir after a clean stop, its WAL checkpointed into the main file."""
    data = tmp_path_factory.mktemp("clean") / "data"
    with ShardqServer(data, shards=1).start() as server:
        with TcpConnection(*server.tcp_address) as c:
            jobs = [{"data": "x" * 200} for _ in range(200)]  # several pages of rows
            assert call(c, cmd="PUSHB", queue="db", jobs=jobs, durable=True)["ok"]
        assert server.stop() == 0
    return data


def _copy_data(src: Path, dst: Path) -> Path:
    """The database files only: the lock file and the old log stay behind."""
    dst.mkdir(parents=True)
    for f in src.glob("shardq.db*"):
        if not f.name.endswith(".lock"):
            shutil.copy(f, dst / f.name)
    return dst


@pytest.mark.parametrize("damage", [_truncate_half, _garbage_header], ids=["truncated", "garbage"])
def test_damaged_wal_restarts_from_a_committed_prefix(
    tmp_path: Path, killed_run: tuple[Path, list[str]], damage: Callable[[Path], None]
) -> None:
    data, ids = _copy_data(killed_run[0], tmp_path / "data"), killed_run[1]
    wal = data / "shardq.db-wal"
    assert wal.exists() and wal.stat().st_size > 0, "the kill should leave a WAL behind"
    damage(wal)
    with ShardqServer(data, shards=1).start() as server:
        present = all_ids(server, "wal")
        # No phantom, and a prefix: a commit is kept only if every earlier one is.
        assert set(present) <= set(ids)
        assert sorted(present, key=ids.index) == ids[: len(present)]
        with TcpConnection(*server.tcp_address) as c:  # and it serves: not a wedge
            assert call(c, cmd="PUSH", queue="wal", data="after", durable=True)["ok"]
        print(f"{damage.__name__}: {len(present)} of {len(ids)} durable pushes kept")
        assert server.stop() == 0


def _corrupt_header(db: Path) -> None:
    with db.open("r+b") as f:
        f.write(b"this is not an SQLite database!!" * 4)


def _corrupt_pages(db: Path) -> None:
    size = db.stat().st_size
    with db.open("r+b") as f:
        for offset in range(4096, size, 4096):  # every page but the first (the header)
            f.seek(offset)
            f.write(os.urandom(512))


@pytest.mark.parametrize("corrupt", [_corrupt_header, _corrupt_pages], ids=["header", "pages"])
def test_corrupt_database_is_refused_with_a_clear_message(
    tmp_path: Path, clean_db: Path, corrupt: Callable[[Path], None]
) -> None:
    data = _copy_data(clean_db, tmp_path / "data")
    corrupt(data / "shardq.db")
    server = ShardqServer(data, shards=1)
    try:
        server.start(wait=False)
        code = server.wait_exit(REFUSAL_S)
        log = server.raw_log()
    finally:
        server.close()
    assert code != 0
    assert "corrupt" in log.lower() or "not a database" in log.lower(), log[-2000:]
