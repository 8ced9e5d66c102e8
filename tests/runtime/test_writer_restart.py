"""A writer killed with SIGKILL loses only what it had not committed, and the shards resend
that: durable pushes in flight are answered once the restarted writer commits them."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from shardq_harness import ShardqServer

from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of

Factory = Callable[..., ShardqServer]
QUEUES = [f"wr-{i}" for i in range(8)]


def _producer(
    server: ShardqServer, ids: list[str], errors: list[str], stop: threading.Event
) -> None:
    with TcpConnection(*server.tcp_address, timeout=30) as conn:
        i = 0
        while not stop.is_set():
            queue = QUEUES[i % len(QUEUES)]
            reply = conn.call({"cmd": "PUSH", "queue": queue, "data": {"i": i}, "durable": True},
                              check=False)  # fmt: skip
            if reply.get("ok"):
                ids.append(reply["id"])
            else:
                errors.append(str(reply.get("error")))
            i += 1


def answered_through_a_writer_kill(
    server: ShardqServer,
    ids: list[str],
    errors: list[str],
    stop: threading.Event,
    thread: threading.Thread,
    more: int,
    what: str,
) -> None:
    """Kill -9 the writer while `thread` pushes (answered ids into `ids`, refusals into
    `errors`) until `stop`: at least `more` answers follow the restarted writer, none is an
    error, and the push in flight when `stop` is set is answered too."""
    writer = server.child_pids()["writer"]
    os.kill(writer, signal.SIGKILL)
    server.wait_child_replaced("writer", writer, 20)
    before = len(ids)
    deadline = time.monotonic() + 20
    while len(ids) < before + more and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(30)
    assert not thread.is_alive(), f"one of the {what} was never answered"
    assert errors == []
    assert len(ids) >= before + more, f"{what} stopped being answered after the restart"


def test_durable_pushes_in_flight_survive_a_writer_kill(shardq_server: Factory) -> None:
    assert {shard_of(q, 2) for q in QUEUES} == {0, 1}
    server = shardq_server(shards=2)
    ids: list[str] = []
    errors: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=_producer, args=(server, ids, errors, stop), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while len(ids) < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    answered_through_a_writer_kill(server, ids, errors, stop, thread, 50, "durable pushes")
    assert server.stop() == 0

    again = shardq_server(shards=2)
    with TcpConnection(*again.tcp_address) as conn:
        replies = conn.call_many([{"cmd": "GetJob", "id": job_id} for job_id in ids], check=False)
    missing = [job_id for job_id, r in zip(ids, replies, strict=True) if not r.get("ok")]
    assert missing == [], f"{len(missing)} of {len(ids)} acknowledged durable pushes lost"
    assert again.stop() == 0
