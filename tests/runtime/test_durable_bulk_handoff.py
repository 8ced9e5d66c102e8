"""A durable PUSHB on a connection handed to its shard (issue 24's durable bulk push, as
bunqueue-client's `add_bulk` sends it: `{"data": ..., "durable": true}` entries).

Against a real server, with raw bunqueue frames: the reply waits for the writer's commit and
the jobs are not deliverable before it (the writer paused with SIGSTOP); a writer killed with
SIGKILL while such pushes stream in loses none that was answered ok. The shard answers these
itself and confirms their jobs only after the reply is written (`ShardCore.after_send`), and
spins through the commit (`spin_commit_max_us`): neither may answer early or lose a job.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable

from shardq_harness import ShardqServer, poll_until
from test_handoff_frames import ENV, WAIT_S, _frame, _Raw, _started, _stats
from test_writer_restart import answered_through_a_writer_kill

from shardq.client._tcp import TcpConnection

Factory = Callable[..., ShardqServer]
QUEUE = "dbulk"


def _pushb(n: int, size: int = 10) -> dict[str, object]:
    jobs = [{"data": {"n": n, "k": k}, "durable": True} for k in range(size)]
    return {"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs, "reqId": f"b{n}"}


def _handed_off(server: ShardqServer) -> _Raw:
    raw = _Raw(server)
    for n in range(8):  # past `tcp_handoff_after` (4) bulk pushes for one shard
        (reply,) = raw.call([_pushb(n)])
        assert reply["ok"] and len(reply["ids"]) == 10, reply
    poll_until(lambda: _stats(server)["handedOff"] == 1, WAIT_S, "the handoff")
    return raw


def test_a_durable_bulk_push_is_answered_and_delivered_only_after_its_commit(
    shardq_server: Factory,
) -> None:
    server = _started(shardq_server)
    raw = _handed_off(server)
    writer = server.child_pids()["writer"]
    os.kill(writer, signal.SIGSTOP)
    try:
        raw.sock.sendall(_frame(_pushb(100)))
        with TcpConnection(*server.tcp_address) as worker:
            poll_until(lambda: _waiting(worker) == 90, WAIT_S, "the shard to take the push")
            # The 80 jobs committed earlier can be pulled; the 10 waiting on the commit not.
            pulled = worker.call({"cmd": "PULLB", "queue": QUEUE, "count": 200})["jobs"]
            assert sorted(j["data"]["n"] for j in pulled) == sorted(
                n for n in range(8) for _ in range(10)
            )
            raw.sock.settimeout(0.5)
            assert _nothing_read(raw), "a durable bulk push was answered before its commit"
            raw.sock.settimeout(WAIT_S)
            os.kill(writer, signal.SIGCONT)
            (reply,) = raw.replies(1)
            assert reply["ok"] and reply["reqId"] == "b100" and len(reply["ids"]) == 10
            pulled = worker.call({"cmd": "PULLB", "queue": QUEUE, "count": 200})["jobs"]
            assert sorted(j["id"] for j in pulled) == sorted(reply["ids"])
    finally:
        os.kill(writer, signal.SIGCONT)  # never leave a stopped process behind
    raw.sock.close()
    assert server.stop() == 0


def _waiting(conn: TcpConnection) -> int:
    counts = conn.call({"cmd": "GetJobCounts", "queue": QUEUE})["counts"]
    return int(counts["waiting"])


def _nothing_read(raw: _Raw) -> bool:
    """Nothing arrives within the socket's timeout (peeked: a late reply stays unread)."""
    try:
        return not raw.sock.recv(65536, socket.MSG_PEEK)
    except TimeoutError:
        return True


def test_durable_bulk_pushes_answered_ok_survive_a_writer_kill(shardq_server: Factory) -> None:
    server = _started(shardq_server)
    raw = _handed_off(server)
    ids: list[str] = []
    errors: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        n = 1000
        while not stop.is_set():
            n += 1
            (reply,) = raw.call([_pushb(n, 50)])
            if reply.get("ok"):
                ids.extend(reply["ids"])
            else:
                errors.append(str(reply.get("error")))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    poll_until(lambda: len(ids) >= 500, WAIT_S, "durable bulk pushes answered")
    answered_through_a_writer_kill(server, ids, errors, stop, thread, 500, "durable bulk pushes")
    raw.sock.close()
    assert server.stop() == 0

    again = shardq_server(shards=2, env=ENV)
    with TcpConnection(*again.tcp_address) as conn:
        replies = conn.call_many([{"cmd": "GetJob", "id": job_id} for job_id in ids], check=False)
    missing = [job_id for job_id, r in zip(ids, replies, strict=True) if not r.get("ok")]
    assert missing == [], f"{len(missing)} of {len(ids)} acknowledged durable jobs lost"
    assert again.stop() == 0
