"""The writer's idle timers are one deadline (`writer/_idle.py`), worked out again only when
something can move one earlier. A commit is such a thing: it wants a vacuum pass once the
writer is idle again. Here no other timer (memory give-back, recycle) is on to wake the
writer, and the first turn after the start's vacuum check only buffers a batch (no commit,
nothing wanted): the pass after the drain must still come, on the commit's own deadline.
"""

from __future__ import annotations

import time

from test_vacuum_server import Factory, file_bytes, push_and_drain

from shardq.client import TcpConnection

JOBS = 2_000
IDLE_MS = 200


def test_a_commit_alone_brings_the_idle_vacuum_with_no_other_timer_on(
    shardq_server: Factory,
) -> None:
    env = {
        "SHARDQ_VACUUM_IDLE_MS": str(IDLE_MS),
        "SHARDQ_VACUUM_MIN_FREE_PAGES": "64",
        "SHARDQ_MEMORY_RELEASE_IDLE_MS": "0",
        "SHARDQ_WRITER_RECYCLE_IDLE_MS": "0",
    }
    server = shardq_server(shards=1, env=env)
    path = server.data_path
    # The start's check (a fresh file: nothing to free, no pass wanted) is IDLE_MS after the
    # start; wait well past it, so that nothing is armed when the next message comes.
    time.sleep(5 * IDLE_MS / 1000)
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        # Buffered: read on a turn that commits nothing (the group commit comes later).
        assert conn.call({"cmd": "PUSH", "queue": "first", "data": {}})["ok"]
        peak = push_and_drain(conn, "big", JOBS, path)
        done = server.wait_for_log("vacuum done", timeout=30)
        assert done["pages"] > JOBS // 4, done
        assert file_bytes(path) < peak // 5, (peak, file_bytes(path), done)
        assert conn.call({"cmd": "Count", "queue": "first"})["count"] == 1
    assert server.stop() == 0, server.log_tail()
