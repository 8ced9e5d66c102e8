"""Records written with every key (before records left out the fields at their default) read
exactly as they did, and the records written now read back as they were written.

`fixtures/full_records/` holds a database that the build of d4dc0e5 wrote and the replies that
server gave about its jobs (`full_records.py` made both). This build opens a copy of it with
its clock set to the moment the replies were taken (the test-only `test_clock_file`: no
delay runs out, no TTL passes) and must give the very same replies, then again after its own
restart. The second test runs the same scenario on this build: every reply after a restart
(recovery from the slim records) is the reply before it.
"""

from __future__ import annotations

import gzip
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
from full_records import DATA, questions, scenario
from shardq_harness import ShardqServer

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
WAIT_S = 30.0


def _answers(server: ShardqServer, cmds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        return _without_req_ids(conn.call_many(cmds, check=False))


def _without_req_ids(replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "reqId"} for r in replies]


def _stored(path: Path) -> list[dict[str, Any]]:
    """The job records as stored, without their patches."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT rec FROM jobs").fetchall()
    db.close()
    return [msgpack.unpackb(rec, raw=False) for (rec,) in rows]


def test_a_database_of_full_records_reads_as_it_did(shardq_server: Factory, tmp_path: Path) -> None:
    recorded = msgpack.unpackb((DATA / "replies.msgpack").read_bytes(), raw=False)
    data = tmp_path / "data"
    data.mkdir()
    (data / "shardq.db").write_bytes(gzip.decompress((DATA / "shardq.db.gz").read_bytes()))
    recs = _stored(data / "shardq.db")  # written with every key, as before
    assert len(recs) == 15 and all(len(r) >= 28 for r in recs)
    clock = tmp_path / "clock"
    clock.write_text(repr(recorded["clock_ms"] / 1000 - time.time()))
    env = {"SHARDQ_TEST_CLOCK_FILE": str(clock)}
    cmds, expected = recorded["questions"], _without_req_ids(recorded["replies"])
    assert sum(r["ok"] for r in expected) == len(expected)  # every question had its answer
    server = shardq_server(shards=1, data_dir=data, env=env)
    assert _answers(server, cmds) == expected
    assert server.stop() == 0, server.log_tail()
    server.start()
    assert _answers(server, cmds) == expected


def test_slim_records_read_back_as_written(shardq_server: Factory) -> None:
    server = shardq_server(shards=1)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        ids = scenario(conn)
    cmds = questions(ids)
    before = _answers(server, cmds)
    assert all(r["ok"] for r in before), before
    assert server.stop() == 0, server.log_tail()
    recs = _stored(server.data_path)
    assert len(recs) == len(ids)
    assert max(len(r) for r in recs) <= 16, recs  # the full ones had 28 to 31 keys
    server.start()
    assert _unbeaten(_answers(server, cmds)) == _unbeaten(before)


def _unbeaten(replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`replies` without the `lastHeartbeat` of the jobs that took a Progress: kept in memory
    only (the start build reads the stored one back too; the first test holds this build to
    what it read)."""
    for reply in replies:
        for job in reply.get("jobs") or [reply.get("job")]:
            if isinstance(job, dict) and job.get("queue") == "done":
                job.pop("lastHeartbeat")
    return replies
