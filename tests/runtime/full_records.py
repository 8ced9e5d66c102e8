"""A database whose job records carry every key, as shardq wrote them before records left out
the fields at their default (docs/runtime.md, "The stored job record"), and the replies the
server that wrote it gave about its jobs (`test_full_records.py` reads both).

The files in `fixtures/full_records/` were made by running this module with the build of
d4dc0e5 (the last one writing full records):

    python tests/runtime/full_records.py /that/venv/bin/shardq tests/runtime/fixtures/full_records

It starts that build on a temporary data dir, runs `scenario` (jobs waiting, prioritised,
LIFO, delayed, completed with and without a result, failed into the DLQ, retried and delayed
again, with progress, logs, a stack, tags, a custom id, a group ...), records the answer of
every command of `questions` for each job after a restart (what that build reads back from
its records), stops the server (SIGTERM) and keeps a copy of the database (`VACUUM INTO`,
gzipped) with the replies and the server's clock at the end.
"""

from __future__ import annotations

import gzip
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
from shardq_harness import ShardqServer  # beside this file: on the path of a script and a test

from shardq.client import TcpConnection

DAY_MS = 86_400_000
DATA = Path(__file__).parent / "fixtures" / "full_records"


class BuildServer(ShardqServer):
    """`ShardqServer` running a given `shardq` executable (another build's)."""

    def __init__(self, shardq: str, data_dir: Path, **kwargs: Any) -> None:
        super().__init__(data_dir, **kwargs)
        self.shardq = shardq

    def command(self) -> list[str]:
        return [self.shardq, *super().command()[3:]]


def _ok(conn: TcpConnection, **cmd: Any) -> dict[str, Any]:
    reply = conn.call(cmd, check=False)
    assert reply.get("ok"), (cmd, reply)
    return reply


def scenario(conn: TcpConnection) -> list[str]:
    """Make jobs in every state with most fields off their default; their ids."""
    ids = list(
        _ok(conn, cmd="PUSHB", queue="plain", jobs=[
            {"data": {"i": 0}}, {"data": {"name": "legacy", "i": 1}}, {"data": None},
            {"data": {}, "name": "named"}, {"data": [1, 2.5, "x"], "durable": True},
        ])["ids"]
    )  # fmt: skip
    for fields in (
        {"data": {"p": 1}, "priority": 5},
        {"data": {"p": 2}, "lifo": True, "maxAttempts": 5, "tags": ["a", "b"]},
        {"data": {"p": 3}, "delay": 300 * DAY_MS, "jobId": "custom-1"},
        {"data": {"p": 4}, "groupId": "g1", "uniqueKey": "u-1", "timeout": 5000},
        {"data": {"p": 5}, "backoff": {"type": "fixed", "delay": 10}, "ttl": 360 * DAY_MS},
    ):
        ids.append(_ok(conn, cmd="PUSH", queue="opts", **fields)["id"])
    ids += _finished(conn)
    return ids


def _finished(conn: TcpConnection) -> list[str]:
    """Jobs completed (with a result, a null result, none), failed and retried."""
    ids = []
    for result in ({"result": {"r": [1, 2]}}, {"result": None}, {}):
        job_id = _ok(conn, cmd="PUSH", queue="done", data={"n": len(ids)})["id"]
        pulled = _ok(conn, cmd="PULL", queue="done", owner="w", lockTtl=600_000)
        token = pulled["token"]
        _ok(conn, cmd="Progress", id=job_id, progress=40, message="almost")
        for line in ("one", "two"):
            _ok(conn, cmd="AddLog", id=job_id, message=line, level="info")
        _ok(conn, cmd="ACK", id=job_id, token=token, **result)
        ids.append(job_id)
    job_id = _ok(conn, cmd="PUSH", queue="dead", data=1, maxAttempts=1)["id"]
    token = _ok(conn, cmd="PULL", queue="dead", owner="w", lockTtl=600_000)["token"]
    _ok(conn, cmd="FAIL", id=job_id, token=token, error="boom", stack=["at a", "at b"])
    ids.append(job_id)
    job_id = _ok(conn, cmd="PUSH", queue="again", data=2, backoff=0)["id"]
    token = _ok(conn, cmd="PULL", queue="again", owner="w", lockTtl=600_000)["token"]
    _ok(conn, cmd="FAIL", id=job_id, token=token, error="once", stack=["at c"])
    deadline = time.monotonic() + 20
    while True:  # the retry is due at once (backoff 0): pulled again, then delayed
        pulled = _ok(conn, cmd="PULL", queue="again", owner="w", lockTtl=600_000)
        if pulled["job"] is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert pulled["job"] is not None and pulled["job"]["id"] == job_id
    _ok(conn, cmd="MoveToDelayed", id=job_id, delay=300 * DAY_MS, token=pulled["token"])
    ids.append(job_id)
    return ids


def questions(ids: Sequence[str]) -> list[dict[str, Any]]:
    """The commands whose answers must not change: per job and per queue."""
    cmds: list[dict[str, Any]] = []
    for job_id in ids:
        for name in ("GetJob", "GetState", "GetResult", "GetLogs"):
            cmds.append({"cmd": name, "id": job_id})
    for queue in ("plain", "opts", "done", "dead", "again"):
        cmds.append({"cmd": "GetJobs", "queue": queue, "limit": 100})
        cmds.append({"cmd": "GetJobCounts", "queue": queue})
    cmds.append({"cmd": "GetJobByCustomId", "customId": "custom-1"})
    return cmds


def clock_ms(conn: TcpConnection) -> int:
    """The server's wall clock, as Ping reports it."""
    return int(_ok(conn, cmd="Ping")["data"]["time"])


def make(shardq: str, out: Path, work: Path) -> None:
    server = BuildServer(shardq, work / "data", shards=1).start(timeout=120)
    try:
        with TcpConnection(*server.tcp_address, timeout=30) as conn:
            ids = scenario(conn)
        assert server.stop() == 0, server.log_tail()
        # The replies of that build reading its own records back (a few fields of memory,
        # as `lastHeartbeat` after a Progress, were never stored).
        server.start(timeout=120)
        cmds = questions(ids)
        with TcpConnection(*server.tcp_address, timeout=30) as conn:
            replies = conn.call_many(cmds, check=False)
            now = clock_ms(conn)
        assert server.stop() == 0, server.log_tail()
    finally:
        server.close()
    out.mkdir(parents=True, exist_ok=True)
    copy = work / "copy.db"
    with sqlite3.connect(server.data_path) as db:
        db.execute("VACUUM INTO ?", (str(copy),))
    db.close()
    (out / "shardq.db.gz").write_bytes(gzip.compress(copy.read_bytes(), mtime=0))
    record = {"clock_ms": now, "questions": cmds, "replies": replies}
    (out / "replies.msgpack").write_bytes(msgpack.packb(record, use_bin_type=True))


if __name__ == "__main__":
    import os
    import tempfile

    target = Path(sys.argv[2]).resolve()
    with tempfile.TemporaryDirectory(prefix="sq-full-") as tmp:
        # Elsewhere than a checkout: `python -m` puts the working directory first on the
        # path of the server's children, which would import this tree's shardq, not its own.
        os.chdir(tmp)
        make(sys.argv[1], target, Path(tmp))
