"""A writer that stops reading never wedges a shard (issue 10, section 3).

The real writer is paused with SIGSTOP while buffered pushes fill its link. Past
`storage_stall_ms` the shard refuses durable pushes at once and keeps answering everything
else; after SIGCONT it catches up, and durable pushes work again.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Callable

from shardq_harness import ShardqServer, poll_until
from wire_clients import Tcp

STALL_MS = 300
BIG = "x" * 100_000
MAX_FILL = 400  # 40 MB: far more than the link's socket buffers hold
# How long a reply may take on a loaded machine; a push held for the writer never comes.
ANSWER_S = 20.0


def test_a_stalled_writer_degrades_durable_pushes_and_service_recovers(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=1, env={"SHARDQ_STORAGE_STALL_MS": str(STALL_MS)})
    writer = server.child_pids()["writer"]
    tcp = Tcp(server.tcp_address)
    os.kill(writer, signal.SIGSTOP)
    try:
        # Buffered pushes are answered at once; their batches pile up in the link.
        filled = 0
        while (
            server.find_log(
                "storage degraded: the writer is not reading; durable pushes are refused"
            )
            is None
        ):
            assert filled < MAX_FILL, "the link never filled"
            assert tcp.call({"cmd": "PUSH", "queue": "fill", "data": BIG}, timeout=5.0)["ok"]
            filled += 1
            if filled % 20 == 0:
                time.sleep(STALL_MS / 1000)  # let the stall bound pass while the link is full
        # Refused at once, not after a wait: the writer stays stopped until these answers
        # come, so a push held for it could only end in the client's timeout (ANSWER_S, far
        # past any stall of the machine), not in this refusal; no wall-time bound needed.
        reply = tcp.call(
            {"cmd": "PUSH", "queue": "d", "data": 1, "durable": True}, timeout=ANSWER_S
        )
        assert reply["ok"] is False and reply["error"].startswith("Storage unavailable"), reply
        assert tcp.call({"cmd": "Ping"}, timeout=ANSWER_S)["ok"]
        assert tcp.call({"cmd": "GetJobCounts", "queue": "d"})["counts"]["waiting"] == 0
        assert server.find_log("storage recovered: the writer reads again") is None
    finally:
        os.kill(writer, signal.SIGCONT)
    poll_until(
        lambda: tcp.call({"cmd": "PUSH", "queue": "d", "data": 2, "durable": True})["ok"],
        10.0,
        "durable pushes to work again",
    )
    server.wait_for_log("storage recovered: the writer reads again")
    tcp.close()
    assert server.stop() == 0
    with sqlite3.connect(f"file:{server.data_path}?mode=ro", uri=True) as db:
        (stored,) = db.execute("SELECT count(*) FROM jobs WHERE queue = 'fill'").fetchone()
    assert stored == filled  # every buffered push reached the disk after the stall
