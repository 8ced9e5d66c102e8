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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shardq_harness import ShardqServer, poll_until
from test_handoff_frames import (
    AFTER,
    WAIT_S,
    Factory,
    _queue_on,
    _Raw,
    _settled,
    _started,
    _stats,
    shared_server,
)
from test_handoff_workers import _call, _counts, _fill, _pull, _worker_round

from shardq.client._errors import ClientError
from shardq.client._tcp import TcpConnection


def _handed_holding(server: ShardqServer, prefix: str, more: int) -> tuple[_Raw, str, str, str]:
    """A connection that leased one job through the front end on shard 0, then was handed
    off to shard 1 by its pulls and acks there (`more` jobs are left on shard 1): the
    connection, the job's id, shard 0's queue and shard 1's."""
    elsewhere, here = _queue_on(0, f"{prefix}far"), _queue_on(1, f"{prefix}near")
    _fill(server, elsewhere, 1)
    _fill(server, here, AFTER + more)
    before = _stats(server)["handedOff"]
    raw = _Raw(server)
    (job,) = _pull(raw, elsewhere, 1)["jobs"]
    for r in range(AFTER):
        _worker_round(raw, here, 1, f"h{r}")
    poll_until(lambda: _stats(server)["handedOff"] > before, WAIT_S, "the handoff")
    return raw, str(job["id"]), elsewhere, here


@pytest.fixture(scope="module")
def cancel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """Shared by the two cancel tests (queues xfar/xnear and bfar/bnear; the second stops
    shard 1 for 0.3 s and lets it go on, in `finally` too): one server start fewer."""
    with shared_server(tmp_path_factory, "cancel") as server:
        yield server


def test_a_cancel_of_a_job_held_on_another_shard_reaches_the_handed_off_worker(
    cancel_server: ShardqServer,
) -> None:
    server = cancel_server
    back = _settled(server)["handedBack"]
    raw, job_id, elsewhere, here = _handed_holding(server, "x", 1)
    try:
        reply = _call(server, {"cmd": "Cancel", "id": job_id, "active": True, "reason": "r"})
        assert reply["ok"] is True, reply
        (notice,) = raw.replies(1)  # unasked, written by shard 1
        assert notice == {"type": "cancel", "jobId": job_id, "queue": elsewhere,
                          "reason": notice.get("reason")}, notice  # fmt: skip
        assert "r" in str(notice["reason"])
        assert _stats(server)["handedBack"] == back  # no hand-back delivered it
        assert _counts(server, elsewhere)["active"] == 0
        # The worker goes on with shard 1, the connection still handed off.
        got: dict[str, Any] = _pull(raw, here, 1)
        assert len(got["jobs"]) == 1
        assert _stats(server)["handedBack"] == back
    finally:
        raw.sock.close()


def test_a_cancel_that_reaches_a_shard_after_the_connection_left_it_follows_it(
    cancel_server: ShardqServer,
) -> None:
    server = cancel_server
    back = _settled(server)["handedBack"]
    raw, job_id, elsewhere, _here = _handed_holding(server, "b", 0)
    shard = server.child_pids()["shard-1"]
    stopped = False
    try:
        # Shard 1 stopped: the front end sends it the cancel (`cancel-for`), and the worker a
        # request it does not serve. Both wait for it; once it runs, it hands the connection
        # back first (the same turn), so the cancel finds it gone and returns to the front
        # end, which holds the connection then, or sends it on until it does.
        os.kill(shard, signal.SIGSTOP)
        stopped = True
        reply = _call(server, {"cmd": "Cancel", "id": job_id, "active": True, "reason": "r"})
        assert reply["ok"] is True, reply
        raw.send([{"cmd": "GetJobCounts", "queue": elsewhere, "reqId": "c"}])
        time.sleep(0.3)
        os.kill(shard, signal.SIGCONT)
        stopped = False
        got = raw.replies(2)
        notices = [r for r in got if r.get("type") == "cancel"]
        assert [n["jobId"] for n in notices] == [job_id], got
        assert [r["reqId"] for r in got if "reqId" in r] == ["c"], got
        assert _stats(server)["handedBack"] == back + 1
    finally:
        if stopped:
            os.kill(shard, signal.SIGCONT)
        raw.sock.close()


def _reaped(pid: int) -> bool:
    """Whether `pid` is reaped: every thread of it exited, so its sockets are closed (a
    thread group leader shows a zombie while its other threads still close them)."""
    return not Path(f"/proc/{pid}").exists()


def _exited(pid: int) -> bool:
    """Whether `pid` exited with every thread, reaped or not: a zombie whose other threads are
    gone holds no socket any more (its parent may be stopped and not reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state == "Z" and os.listdir(f"/proc/{pid}/task") == [str(pid)]
    except OSError:
        return True


def _front_end_back(server: ShardqServer, old: int) -> bool:
    try:
        with TcpConnection(*server.tcp_address, timeout=1) as conn:
            conn.call({"cmd": "Ping"})
    except (OSError, ClientError):
        return False
    return server.child_pids().get("frontend") not in (None, old)


def _leasing_worker(server: ShardqServer, prefix: str = "g") -> tuple[_Raw, str, str]:
    """A connection handed off to shard 1 holding leases of 10 minutes: one taken through
    the front end on shard 0, two by shard 1; and those queues."""
    raw, _job_id, elsewhere, here = _handed_holding(server, prefix, 2)
    assert len(_pull(raw, here, 2)["jobs"]) == 2
    return raw, elsewhere, here


def _kill_front_end(server: ShardqServer) -> int:
    old: int = server.child_pids()["frontend"]
    os.kill(old, signal.SIGKILL)
    poll_until(lambda: _reaped(old), WAIT_S, "the front end's death")
    return old


def _active(server: ShardqServer, elsewhere: str, here: str) -> int:
    return _counts(server, here)["active"] + _counts(server, elsewhere)["active"]


def _released(server: ShardqServer, elsewhere: str, here: str) -> None:
    """Every lease of the worker released on both shards, long before its lockTtl."""
    poll_until(
        lambda: _active(server, elsewhere, here) == 0,
        WAIT_S,
        "the leases released",
        detail=server.log_tail,
    )
    assert _counts(server, elsewhere)["waiting"] == 1
    assert _counts(server, here)["waiting"] == 2


@pytest.mark.parametrize("ends", ["closed while it is down", "handed back after"])
def test_a_handed_off_worker_that_ends_around_a_front_end_restart_gives_its_jobs_back(
    shardq_server: Factory, ends: str
) -> None:
    server = _started(shardq_server)
    raw, elsewhere, here = _leasing_worker(server)
    try:
        old = _kill_front_end(server)
        if ends == "closed while it is down":
            raw.sock.close()  # ends at shard 1 with no front end to tell: remembered there
        poll_until(lambda: _front_end_back(server, old), WAIT_S, "the restarted front end")
        if ends == "handed back after":
            # A request shard 1 does not serve: back to a front end that does not know the
            # connection, which closes it (the client reconnects) and releases what it held.
            raw.send([{"cmd": "GetJobCounts", "queue": elsewhere, "reqId": "c"}])
            assert raw.sock.recv(65536) == b""
        _released(server, elsewhere, here)
    finally:
        raw.sock.close()


def test_a_shard_remembers_at_most_tcp_handoff_gone_max_ended_connections(
    shardq_server: Factory,
) -> None:
    server = _started(shardq_server, {"SHARDQ_TCP_HANDOFF_GONE_MAX": "1"})
    old_raw, *old_queues = _leasing_worker(server, "g1")
    new_raw, *new_queues = _leasing_worker(server, "g2")
    # The supervisor is stopped while both connections end, so no front end is back before
    # the second one ends (a restart takes only ~0.1 s of backoff and a fast start).
    os.kill(server.pid, signal.SIGSTOP)
    try:
        old = server.child_pids()["frontend"]
        os.kill(old, signal.SIGKILL)
        poll_until(lambda: _exited(old), WAIT_S, "the front end's death")
        old_raw.sock.close()
        time.sleep(0.3)  # shard 1 sees it end first: the one it forgets for the newer
        new_raw.sock.close()
        time.sleep(0.3)
        os.kill(server.pid, signal.SIGCONT)
        poll_until(lambda: _front_end_back(server, old), WAIT_S, "the restarted front end")
        _released(server, *new_queues)
        time.sleep(0.5)  # reported oldest first: had it been kept, it would be released
        assert _active(server, *old_queues) == 3  # left to its lockTtl (10 minutes)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        old_raw.sock.close()
        new_raw.sock.close()
