"""What a shard has sent its writer and not seen committed stays within
`writer_unconfirmed_max_bytes`, and the back-pressure that keeps it there loses nothing.

The real writer is paused with SIGSTOP (never long enough to count as stalled: the stall
bound is set far away), so nothing commits while a producer pushes jobs of about 10 KB one
after another. Past the bound the shard reads no more requests: only the pushes that fit are
answered. The writer is then killed with SIGKILL while paused; its replacement gets every
unconfirmed batch again and the producer carries on. Before that, a shard killed with
SIGKILL mid-stream lost none of the pushes it had answered.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable

from shardq_harness import ShardqServer, poll_until
from wire_clients import Tcp

BOUND = 64 * 1024
DATA = "x" * 10_000  # each push a batch of a little more than this
# The most pushes answered while nothing commits: the one whose batch passes the bound is
# still answered (the check comes before the next read), none after it.
MAX_ANSWERED_PAUSED = BOUND // len(DATA) + 1
PUSHES = 40


def _push(tcp: Tcp, job_id: str) -> bool:
    reply = tcp.call({"cmd": "PUSH", "queue": "ub", "data": DATA, "jobId": job_id}, timeout=60)
    return reply["ok"] is True


def _stored_ids(server: ShardqServer) -> set[str]:
    with sqlite3.connect(f"file:{server.data_path}?mode=ro", uri=True) as db:
        return {row[0].split("\x1f")[0] for row in db.execute("SELECT id FROM jobs")}


class _Producer(threading.Thread):
    """Buffered pushes one after another; `answered` lists the acknowledged ids."""

    def __init__(self, address: tuple[str, int], prefix: str, count: int) -> None:
        super().__init__(daemon=True)
        self.address, self.prefix, self.count = address, prefix, count
        self.answered: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        tcp = Tcp(self.address, timeout=60)
        try:
            for n in range(self.count):
                job_id = f"{self.prefix}-{n}"
                if _push(tcp, job_id):
                    self.answered.append(job_id)
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            tcp.close()


def test_unconfirmed_batches_stay_bounded_and_nothing_answered_is_lost(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(
        shards=1,
        env={
            "SHARDQ_WRITER_UNCONFIRMED_MAX_BYTES": str(BOUND),
            "SHARDQ_STORAGE_STALL_MS": "600000",
        },
    )
    answered: list[str] = []

    # A shard killed mid-stream: what it answered was handed to the writer first.
    first = _Producer(server.tcp_address, "a", PUSHES)
    first.start()
    poll_until(lambda: len(first.answered) >= PUSHES // 4, 30, "the first pushes")
    old_shard = server.child_pids()["shard-0"]
    os.kill(old_shard, signal.SIGKILL)
    first.join(60)
    assert not first.is_alive()
    answered += first.answered  # the pushes after the kill may have failed: not answered ok
    server.wait_child_replaced("shard-0", old_shard)

    # Nothing commits: the shard stops reading requests at the bound.
    writer = server.child_pids()["writer"]
    os.kill(writer, signal.SIGSTOP)
    paused = _Producer(server.tcp_address, "b", PUSHES)
    try:
        paused.start()
        poll_until(lambda: len(paused.answered) >= MAX_ANSWERED_PAUSED - 1, 30, "pushes in")
        time.sleep(1.0)  # room for pushes past the bound to be (wrongly) answered
        assert len(paused.answered) <= MAX_ANSWERED_PAUSED, paused.answered
    finally:
        os.kill(writer, signal.SIGKILL)  # a paused process dies too
    paused.join(60)
    assert not paused.is_alive() and paused.error is None, paused.error
    assert len(paused.answered) == PUSHES  # the new writer got every batch again
    answered += paused.answered

    assert server.stop() == 0
    assert set(answered) <= _stored_ids(server)
    stops = [
        line
        for line in server.logs(strict=False)
        if line.get("event") == "shard stopped" and line.get("role") == "shard-0"
    ]
    assert stops, server.log_tail()
    # The bound, passed by one push's batch at most (the one answered past it).
    assert 0 < stops[-1]["unconfirmed_peak_bytes"] <= BOUND + len(DATA) + 1024
    assert stops[-1]["commit_waits"] > 0
