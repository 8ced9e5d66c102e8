"""A job's push, lease and completion written in one flush window survive a writer killed
with SIGKILL before that window's commit: the shard resends the batches, the restarted writer
folds them into one row write (`shardq.storage._coalesce`) and the job is stored completed
(or gone, with `removeOnComplete`), never left waiting or active.

The window is made long (`SHARDQ_FLUSH_INTERVAL_MS`) so that the three land in it for sure:
- "one row": the push is buffered, so the put, the lease and the completion of every job
  are one batch's (one INSERT each);
- "stored row": the push is durable, so its row is committed before the pull, and the lease
  and the completion of the jobs pulled together are one change of stored rows (one UPDATE
  naming all their ids, `_write_updates.write_groups`);
- "removed": as "stored row", with `removeOnComplete`: the lease and the deletion come to
  one DELETE.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
from shardq_harness import ShardqServer

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
JOBS = 40
LONG_WINDOW = {"SHARDQ_FLUSH_INTERVAL_MS": "3000", "SHARDQ_FLUSH_MAX_MUTATIONS": "100000"}


def _pushed_pulled_acked(conn: TcpConnection, queue: str, options: dict[str, Any]) -> list[str]:
    """Push `JOBS` jobs (with `options`), pull and acknowledge them; their ids."""
    jobs = [{"data": {"i": i}, **options} for i in range(JOBS)]
    pushed = conn.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs})
    pulled = conn.call({"cmd": "PULLB", "queue": queue, "count": JOBS, "owner": "w"})
    ids = [job["id"] for job in pulled["jobs"]]
    assert sorted(ids) == sorted(pushed["ids"])
    conn.call({"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"]})
    return ids


@pytest.mark.parametrize(
    ("case", "options"),
    [
        ("one row", {}),
        ("stored row", {"durable": True}),
        ("removed", {"durable": True, "removeOnComplete": True}),
    ],
)
def test_push_lease_and_completion_in_one_window_survive_a_writer_kill(
    shardq_server: Factory, case: str, options: dict[str, Any]
) -> None:
    server = shardq_server(shards=1, env=LONG_WINDOW)
    queue = f"coalesced-{case.replace(' ', '-')}"
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        ids = _pushed_pulled_acked(conn, queue, options)
        writer = server.child_pids()["writer"]
        os.kill(writer, signal.SIGKILL)  # answered, not committed: the window is 3 s long
        server.wait_child_replaced("writer", writer, 20)
        # The next batch goes after the ones the shard resends: a job of its own, as a mark.
        conn.call({"cmd": "PUSH", "queue": f"{queue}-after", "data": {}, "durable": True})
    assert server.stop() == 0

    again = shardq_server(shards=1)
    with TcpConnection(*again.tcp_address, timeout=30) as conn:
        replies = conn.call_many([{"cmd": "GetJob", "id": job_id} for job_id in ids], check=False)
        counts = conn.call({"cmd": "GetJobCounts", "queue": queue})
    if options.get("removeOnComplete"):
        assert [r.get("job") for r in replies] == [None] * JOBS, replies[:2]
    else:
        assert [r["job"]["state"] for r in replies] == ["completed"] * JOBS, replies[:2]
        assert [len(r["job"]["timeline"]) for r in replies] == [3] * JOBS, replies[:1]
    waiting = {k: v for k, v in counts.items() if k in ("waiting", "active", "delayed") and v}
    assert waiting == {}, counts
    assert again.stop() == 0
