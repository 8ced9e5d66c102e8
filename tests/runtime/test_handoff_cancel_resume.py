"""A cancel that reaches the front end while a handed-back connection is on its way back
(docs/runtime.md "Handed-off connections"): the front end has taken the descriptor back but
not yet made its transport (`TcpConnection.resume_with` until `_resumed`). The cancel is
queued on the connection then and written once it is resumed, before anything else it is
sent; it was never lost, and nothing else is written twice.

A real sequence, no timing hook: the worker holds a job on shard 0 and is handed off to
shard 1. Shard 0 is stopped and the job cancelled (the front end sends the Cancel on to it).
The front end is stopped, and the worker sends a request shard 1 does not serve: shard 1
hands the connection back into the stopped front end's socket. Shard 0 is let go: it
cancels the job and sends the cancel of the worker's connection into the front end's link,
after the hand-back. Let go, the front end reads both in one loop turn, in the order they
came (epoll's ready list): the hand-back, then the cancel while the transport is being made.

Raw sockets against a real server with two shards, as `test_handoff_cancel.py`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from shardq_harness import poll_until
from test_handoff_cancel import _handed_holding
from test_handoff_frames import WAIT_S, Factory, _Raw, _settled, _started, _stats
from test_handoff_workers import _counts

SETTLE_S = 0.3  # for a running shard to act on what waits in its sockets (as the others)


def _sleeping(pid: int) -> bool:
    """Whether `pid` waits in the kernel (its loop is idle): state S, not R."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"


def test_a_cancel_queued_while_the_connection_comes_back_is_written_once_it_is_back(
    shardq_server: Factory,
) -> None:
    server = _started(shardq_server)
    back = _settled(server)["handedBack"]
    raw, job_id, elsewhere, _here = _handed_holding(server, "r", 0)
    pids = server.child_pids()
    far, near, front = pids["shard-0"], pids["shard-1"], pids["frontend"]
    canceller = _Raw(server)
    stopped: list[int] = []

    def stop(pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)

    def go_on(pid: int) -> None:
        """Let `pid` run and wait until it has handled what waited for it (idle again)."""
        os.kill(pid, signal.SIGCONT)
        stopped.remove(pid)
        time.sleep(SETTLE_S)
        poll_until(lambda: _sleeping(pid), WAIT_S, f"{pid} idle again")

    try:
        stop(far)
        canceller.send([{"cmd": "Cancel", "id": job_id, "active": True, "reason": "r",
                         "reqId": "x"}])  # fmt: skip
        time.sleep(SETTLE_S)  # the front end has sent it on to the stopped shard 0
        stop(front)
        raw.send([{"cmd": "GetJobCounts", "queue": elsewhere, "reqId": "c"}])
        time.sleep(SETTLE_S)  # shard 1 hands the connection back (into the stopped front end)
        poll_until(lambda: _sleeping(near), WAIT_S, "shard 1 idle again")
        go_on(far)  # the cancel of the worker's connection, after the hand-back
        os.kill(front, signal.SIGCONT)
        stopped.remove(front)
        (cancelled,) = canceller.replies(1)
        assert cancelled["ok"] is True, cancelled
        got = raw.replies(2)
        assert got[0] == {"type": "cancel", "jobId": job_id, "queue": elsewhere,
                          "reason": got[0].get("reason")}, got  # fmt: skip
        assert got[1]["reqId"] == "c" and got[1]["ok"] is True, got
        assert _stats(server)["handedBack"] == back + 1
        assert _counts(server, elsewhere)["active"] == 0
        # Nothing more is written to it: the cancel went out once.
        raw.sock.settimeout(SETTLE_S)
        try:
            extra = raw.sock.recv(65536)
        except TimeoutError:
            extra = b""
        assert extra == b"", extra
        assert server.find_log("cancel not pushed: the worker is not reading") is None
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        raw.sock.close()
        canceller.sock.close()
