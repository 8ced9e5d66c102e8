"""A handed-off worker that holds jobs on two shards (docs/runtime.md "Handed-off
connections"): the cancel of a job it pulled through the front end from another shard reaches
it (the job's shard sends it to the front end, which no longer holds the socket; it goes on to
the shard that does, `cancel-for`, which writes it as its own cancels); and its leases come
back at once when it ends while the front end is restarting (the shard reports it `gone` to
the new front end, `tcp_handoff_gone_max`), not at their lockTtl.

Raw sockets against a real server with two shards, the queues chosen one per shard.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from shardq_harness import ShardqServer, poll_until
from test_handoff_frames import AFTER, WAIT_S, Factory, _queue_on, _Raw, _started, _stats
from test_handoff_workers import _call, _counts, _fill, _pull, _worker_round

from shardq.client._errors import ClientError
from shardq.client._tcp import TcpConnection


def test_a_cancel_of_a_job_held_on_another_shard_reaches_the_handed_off_worker(
    shardq_server: Factory,
) -> None:
    server = _started(shardq_server)
    elsewhere, here = _queue_on(0, "xfar"), _queue_on(1, "xnear")
    _fill(server, elsewhere, 1)
    _fill(server, here, AFTER + 1)
    raw = _Raw(server)
    try:
        # X leased through the front end on shard 0, then the connection goes to shard 1.
        (job,) = _pull(raw, elsewhere, 1)["jobs"]
        for r in range(AFTER):
            _worker_round(raw, here, 1, f"h{r}")
        poll_until(lambda: _stats(server)["handedOff"] == 1, WAIT_S, "the handoff")
        reply = _call(server, {"cmd": "Cancel", "id": job["id"], "active": True, "reason": "r"})
        assert reply["ok"] is True, reply
        (notice,) = raw.replies(1)  # unasked, written by shard 1
        assert notice == {"type": "cancel", "jobId": job["id"], "queue": elsewhere,
                          "reason": notice.get("reason")}, notice  # fmt: skip
        assert "r" in str(notice["reason"])
        assert _stats(server)["handedBack"] == 0  # no hand-back delivered it
        assert _counts(server, elsewhere)["active"] == 0
        # The worker goes on with shard 1, the connection still handed off.
        got: dict[str, Any] = _pull(raw, here, 1)
        assert len(got["jobs"]) == 1
        assert _stats(server)["handedBack"] == 0
    finally:
        raw.sock.close()


def test_a_cancel_that_reaches_a_shard_after_the_connection_left_it_follows_it(
    shardq_server: Factory,
) -> None:
    server = _started(shardq_server)
    elsewhere, here = _queue_on(0, "xback"), _queue_on(1, "xhere")
    _fill(server, elsewhere, 1)
    _fill(server, here, AFTER)
    raw = _Raw(server)
    shard = server.child_pids()["shard-1"]
    stopped = False
    try:
        (job,) = _pull(raw, elsewhere, 1)["jobs"]
        for r in range(AFTER):
            _worker_round(raw, here, 1, f"h{r}")
        poll_until(lambda: _stats(server)["handedOff"] == 1, WAIT_S, "the handoff")
        # Shard 1 stopped: the front end sends it the cancel (`cancel-for`), and the worker a
        # request it does not serve. Both wait for it; once it runs, it hands the connection
        # back first (the same turn), so the cancel finds it gone and returns to the front
        # end, which holds the connection then, or sends it on until it does.
        os.kill(shard, signal.SIGSTOP)
        stopped = True
        reply = _call(server, {"cmd": "Cancel", "id": job["id"], "active": True, "reason": "r"})
        assert reply["ok"] is True, reply
        raw.send([{"cmd": "GetJobCounts", "queue": elsewhere, "reqId": "c"}])
        time.sleep(0.3)
        os.kill(shard, signal.SIGCONT)
        stopped = False
        got = raw.replies(2)
        notices = [r for r in got if r.get("type") == "cancel"]
        assert [n["jobId"] for n in notices] == [job["id"]], got
        assert [r["reqId"] for r in got if "reqId" in r] == ["c"], got
        assert _stats(server)["handedBack"] == 1
    finally:
        if stopped:
            os.kill(shard, signal.SIGCONT)
        raw.sock.close()


def _reaped(pid: int) -> bool:
    """Whether `pid` is reaped: every thread of it exited, so its sockets are closed (a
    thread group leader shows a zombie while its other threads still close them)."""
    return not Path(f"/proc/{pid}").exists()


def _front_end_back(server: ShardqServer, old: int) -> bool:
    try:
        with TcpConnection(*server.tcp_address, timeout=1) as conn:
            conn.call({"cmd": "Ping"})
    except (OSError, ClientError):
        return False
    return server.child_pids().get("frontend") not in (None, old)


def _leasing_worker(server: ShardqServer) -> tuple[_Raw, str, str]:
    """A connection handed off to shard 1 holding leases of 10 minutes: one taken through
    the front end on shard 0, two by shard 1; and those queues."""
    elsewhere, here = _queue_on(0, "gfar"), _queue_on(1, "gnear")
    _fill(server, elsewhere, 1)
    _fill(server, here, AFTER + 2)
    raw = _Raw(server)
    assert len(_pull(raw, elsewhere, 1)["jobs"]) == 1
    for r in range(AFTER):
        _worker_round(raw, here, 1, f"h{r}")
    poll_until(lambda: _stats(server)["handedOff"] == 1, WAIT_S, "the handoff")
    assert len(_pull(raw, here, 2)["jobs"]) == 2
    return raw, elsewhere, here


def _kill_front_end(server: ShardqServer) -> int:
    old: int = server.child_pids()["frontend"]
    os.kill(old, signal.SIGKILL)
    poll_until(lambda: _reaped(old), WAIT_S, "the front end's death")
    return old


def _released(server: ShardqServer, elsewhere: str, here: str) -> None:
    """Every lease of the worker released on both shards, long before its lockTtl."""
    poll_until(
        lambda: _counts(server, here)["active"] + _counts(server, elsewhere)["active"] == 0,
        WAIT_S,
        "the leases released",
        detail=server.log_tail,
    )
    assert _counts(server, elsewhere)["waiting"] == 1
    assert _counts(server, here)["waiting"] == 2


def test_a_worker_that_ends_while_the_front_end_restarts_gives_its_jobs_back_at_once(
    shardq_server: Factory,
) -> None:
    server = _started(shardq_server)
    raw, elsewhere, here = _leasing_worker(server)
    try:
        old = _kill_front_end(server)
    finally:
        raw.sock.close()  # ends at shard 1 with no front end to tell: remembered there
    poll_until(lambda: _front_end_back(server, old), WAIT_S, "the restarted front end")
    _released(server, elsewhere, here)


def test_a_worker_handed_back_to_a_restarted_front_end_gives_its_jobs_back(
    shardq_server: Factory,
) -> None:
    server = _started(shardq_server)
    raw, elsewhere, here = _leasing_worker(server)
    try:
        old = _kill_front_end(server)
        poll_until(lambda: _front_end_back(server, old), WAIT_S, "the restarted front end")
        # A request shard 1 does not serve: back to a front end that does not know the
        # connection, which closes it (the client reconnects) and releases what it held.
        raw.send([{"cmd": "GetJobCounts", "queue": elsewhere, "reqId": "c"}])
        assert raw.sock.recv(65536) == b""
        _released(server, elsewhere, here)
    finally:
        raw.sock.close()
