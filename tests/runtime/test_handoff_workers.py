"""Worker connections handed off (`tcp_handoff`, docs/runtime.md "Handed-off connections"):
a connection whose last requests were pushes, pulls and acks for one shard is served by that
shard, PULLB and ACKB included (`shard._direct_work`), with the replies the front end would
send; its leases end as a closed connection's do, its long-polls never hold a hand-back or a
stop, the cancels of its jobs reach it, and a kill -9 of its shard loses nothing acknowledged.

Raw sockets against real servers, so that the bytes of each reply are the test's to compare.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import msgpack  # type: ignore[import-untyped]
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

from shardq.client._tcp import TcpConnection

# VOLATILE: values that differ between two runs of the same commands: ids, tokens, times
# (the worker registry's too, `test_handoff_registry.py`).
VOLATILE = frozenset({"id", "jobId", "ids", "token", "tokens", "createdAt", "timestamp",
                      "startedAt", "processedOn", "runAt", "lockedUntil", "time", "timeline",
                      "lastHeartbeat", "completedAt", "finishedOn", "lastSeen",
                      "uptime"})  # fmt: skip
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_UUID_B = re.compile(_UUID.pattern.encode())


def _call(server: ShardqServer, cmd: dict[str, Any]) -> dict[str, Any]:
    with TcpConnection(*server.tcp_address) as conn:
        reply: dict[str, Any] = conn.call(cmd)
        return reply


def _fill(server: ShardqServer, queue: str, n: int) -> None:
    jobs = [{"name": "w", "data": {"n": i, "big": 2**40 + i}} for i in range(n)]
    reply = _call(server, {"cmd": "PUSHB", "queue": queue, "jobs": jobs})
    assert reply["ok"] is True, reply


def _shape(value: Any, key: str = "") -> Any:
    """`value` with what differs between runs (`VOLATILE`) reduced to its type; a map as
    its items in order, so that key order counts."""
    if key in VOLATILE:
        return type(value).__name__
    if isinstance(value, dict):
        return [(k, _shape(v, k)) for k, v in value.items()]
    if isinstance(value, list):
        return [_shape(v) for v in value]
    if isinstance(value, str):
        return _UUID.sub("<id>", value)  # a job id inside an error
    return (type(value).__name__, value)  # 2**40 and 2.0**40: not the same bytes


def _worker_round(raw: _Raw, queue: str, n: int, tag: str) -> list[bytes]:
    """PULLB `n` then ACKB of what came: the reply bodies."""
    raw.send([{"cmd": "PULLB", "queue": queue, "count": n, "owner": "w1", "reqId": f"{tag}p"}])
    (pulled,) = raw.bodies(1)
    reply = msgpack.unpackb(pulled, raw=False)
    ids = [j["id"] for j in reply["jobs"]]
    raw.send([{"cmd": "ACKB", "ids": ids, "tokens": reply["tokens"], "reqId": f"{tag}a"}])
    return [pulled, *raw.bodies(1)]


# Replies over 1 MiB are cut on both module servers (`_big_pull`); every other reply of the
# module's tests is a few KB.
SMALL_LINK = {"SHARDQ_LINK_MAX_FRAME_BYTES": str(1 << 20)}


@pytest.fixture(scope="module")
def workers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """Shared by the seven tests that neither kill nor stop a process of it (queues same,
    leases, parked, cancel, idle and busy, waitq, cut): six server starts fewer."""
    with shared_server(tmp_path_factory, "workers", SMALL_LINK) as server:
        yield server


@pytest.fixture(scope="module")
def off_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """The same with `tcp_handoff` off, which the tests compare against (same, cut): two
    server starts fewer."""
    off = {**SMALL_LINK, "SHARDQ_TCP_HANDOFF": "false"}
    with shared_server(tmp_path_factory, "off", off) as server:
        yield server


_COUNTED = ("handedOff", "handedBack", "directRequests")


def _script(server: ShardqServer, queue: str) -> tuple[list[bytes], dict[str, Any]]:
    """The same worker's requests against `server`: the reply bodies, and what they added
    to its Stats' `_COUNTED` and Metrics' totalPulled and totalCompleted."""
    settled = _settled(server)
    was = _call(server, {"cmd": "Metrics"})["metrics"]
    _fill(server, queue, 40)
    raw = _Raw(server)
    try:
        bodies: list[bytes] = []
        for r in range(AFTER):  # enough for a handoff (pulls and acks for one shard)
            bodies += _worker_round(raw, queue, 3, f"r{r}")
        time.sleep(0.2)  # a handoff, if any, has happened
        bodies += _worker_round(raw, queue, 5, "big")
        # PULL and ACK, a stale token (fenced), an ACKB naming a job done already.
        raw.send([{"cmd": "PULL", "queue": queue, "owner": "w1", "reqId": 7}])
        (pulled,) = raw.bodies(1)
        job = msgpack.unpackb(pulled, raw=False)
        raw.send([{"cmd": "ACK", "id": job["job"]["id"], "token": "stale", "reqId": 8}])
        raw.send([{"cmd": "ACK", "id": job["job"]["id"], "token": job["token"], "reqId": 9},
                  {"cmd": "PULLB", "queue": queue, "count": 2, "owner": "w1",
                   "reqId": 10}])  # fmt: skip
        bodies += [pulled, *raw.bodies(3)]
        last = msgpack.unpackb(bodies[-1], raw=False)
        ids = [j["id"] for j in last["jobs"]]
        raw.send([{"cmd": "ACKB", "ids": ids, "tokens": [1, 2], "reqId": "schema"},
                  {"cmd": "ACKB", "ids": ids, "tokens": ["x", "y"], "reqId": "badtok"},
                  {"cmd": "ACKB", "ids": ids, "tokens": last["tokens"], "reqId": "ok"},
                  {"cmd": "ACKB", "ids": ids, "tokens": last["tokens"], "reqId": "again"},
                  {"cmd": "PULLB", "queue": queue, "count": 100, "reqId": "rest"},
                  {"cmd": "PULLB", "queue": queue, "count": 5, "reqId": "empty"}])  # fmt: skip
        bodies += raw.bodies(6)
        # A job of the other shard's: not this shard's to ack (back to the front end).
        other = _queue_on(0, "same")
        _fill(server, other, 2)
        got = _call(server, {"cmd": "PULLB", "queue": other, "count": 2, "owner": "w2"})
        bodies += raw.call_bodies([{"cmd": "ACK", "id": got["jobs"][0]["id"],
                                    "token": got["tokens"][0], "reqId": "other"}])  # fmt: skip
        # Handed off again (pushes), then an ACKB of the other shard's job: back again.
        time.sleep(0.3)
        pushes = [{"cmd": "PUSH", "queue": queue, "data": i, "reqId": i} for i in range(AFTER)]
        bodies += raw.call_bodies(pushes)
        time.sleep(0.3)
        bodies += raw.call_bodies([{"cmd": "ACKB", "ids": [got["jobs"][1]["id"]],
                                    "tokens": [got["tokens"][1]], "reqId": "otherb"}])  # fmt: skip
        metrics = _call(server, {"cmd": "Metrics"})["metrics"]
        now = _stats(server)
        stats: dict[str, Any] = {k: now[k] - settled[k] for k in _COUNTED}
        stats["metrics"] = [metrics[k] - was[k] for k in ("totalPulled", "totalCompleted")]
        return bodies, stats
    finally:
        raw.sock.close()


def test_a_handed_off_worker_gets_the_front_ends_replies(
    workers_server: ShardqServer, off_server: ShardqServer
) -> None:
    queue = _queue_on(1, "same")
    handed, handed_stats = _script(workers_server, queue)
    kept, kept_stats = _script(off_server, queue)
    assert handed_stats["handedOff"] >= 1 and kept_stats["handedOff"] == 0
    assert handed_stats["directRequests"] >= 12  # the pulls and acks after the handoff
    # Metrics counts them wherever they were served.
    assert handed_stats["metrics"] == kept_stats["metrics"]
    assert handed_stats["metrics"][0] == 42  # the other shard's jobs too
    assert handed_stats["handedOff"] == 2 and handed_stats["handedBack"] == 2
    assert [_shape(msgpack.unpackb(b, raw=False)) for b in handed] == [
        _shape(msgpack.unpackb(b, raw=False)) for b in kept
    ]
    # The bytes too, where no id, token or time lies in them.
    for a, b in zip(handed, kept, strict=True):
        reply = msgpack.unpackb(a, raw=False)
        if not reply.get("jobs") and not reply.get("job"):
            assert _UUID_B.sub(b"-" * 36, a) == _UUID_B.sub(b"-" * 36, b), reply


def _handed_worker(server: ShardqServer, queue: str, *, rounds: int = AFTER) -> _Raw:
    """A connection that pulled and acked one job at a time `rounds` times, handed off."""
    before = _stats(server)["handedOff"]
    raw = _Raw(server)
    for r in range(rounds):
        _worker_round(raw, queue, 1, f"h{r}")
    poll_until(lambda: _stats(server)["handedOff"] > before, WAIT_S, "the handoff")
    return raw


def _counts(server: ShardqServer, queue: str) -> dict[str, int]:
    counts: dict[str, int] = _call(server, {"cmd": "GetJobCounts", "queue": queue})["counts"]
    return counts


def _pull(raw: _Raw, queue: str, n: int, **extra: Any) -> dict[str, Any]:
    cmd = {"cmd": "PULLB", "queue": queue, "count": n, "owner": "w", "lockTtl": 600_000}
    (reply,) = raw.call([{**cmd, **extra}])
    assert reply["ok"] is True, reply
    return reply


def test_a_handed_off_workers_leases_are_released_when_it_closes(
    workers_server: ShardqServer,
) -> None:
    server = workers_server
    queue = _queue_on(1, "leases")
    back = _settled(server)["handedBack"]
    _fill(server, queue, 30)
    # One closes while its shard holds it; one is handed back first, then closes.
    first = _handed_worker(server, queue)
    assert len(_pull(first, queue, 5)["jobs"]) == 5
    second = _handed_worker(server, queue)
    assert len(_pull(second, queue, 5)["jobs"]) == 5
    (counts,) = second.call([{"cmd": "GetJobCounts", "queue": queue}])  # not the shard's
    poll_until(lambda: _stats(server)["handedBack"] == back + 1, WAIT_S, "the hand-back")
    assert counts["counts"]["active"] == 10
    first.sock.close()
    second.sock.close()
    # Back to waiting long before their 10-minute lease: released at the close.
    acked = 2 * AFTER
    poll_until(lambda: _counts(server, queue)["active"] == 0, WAIT_S, "the leases released")
    counts = _counts(server, queue)
    assert (counts["waiting"], counts["completed"]) == (30 - acked, acked)


def _parked(server: ShardqServer, prefix: str) -> tuple[ShardqServer, str, _Raw]:
    """A handed-off worker whose long-poll is parked in the shard (its queue is empty) for a
    minute, past the socket's timeout: nothing may wait for it."""
    queue = _queue_on(1, prefix)
    _fill(server, queue, AFTER)
    raw = _handed_worker(server, queue)
    raw.send([{"cmd": "PULLB", "queue": queue, "count": 1, "timeout": 60_000, "reqId": "lp"}])
    time.sleep(0.3)
    return server, queue, raw


def test_a_parked_long_poll_does_not_hold_a_hand_back(workers_server: ShardqServer) -> None:
    back = _settled(workers_server)["handedBack"]
    server, queue, raw = _parked(workers_server, "parked")
    try:
        # The request the shard does not serve waits for no long-poll.
        raw.send([{"cmd": "GetJobCounts", "queue": queue, "reqId": "counts"}])
        replies = {r["reqId"]: r for r in raw.replies(2)}
        assert replies["lp"] == {"ok": True, "jobs": [], "reqId": "lp"}
        assert replies["counts"]["counts"]["completed"] == AFTER
        assert _stats(server)["handedBack"] == back + 1
        # The front end serves it on, long-polls included.
        _fill(server, queue, 1)
        got = _pull(raw, queue, 1, timeout=5_000)
        assert len(got["jobs"]) == 1
    finally:
        raw.sock.close()


def test_a_stopping_shard_answers_a_parked_long_poll_and_hands_back(
    shardq_server: Factory,
) -> None:
    server, queue, raw = _parked(_started(shardq_server), "stop")
    try:
        old = server.child_pids()["shard-1"]
        os.kill(old, signal.SIGTERM)
        (reply,) = raw.replies(1)
        assert reply == {"ok": True, "jobs": [], "reqId": "lp"}
        server.wait_child_replaced("shard-1", old)
        # The same connection, with the front end now: served by the new shard process.
        _fill(server, queue, 1)
        got = _pull(raw, queue, 1)
        assert len(got["jobs"]) == 1
    finally:
        raw.sock.close()


def test_a_handed_off_worker_is_told_its_job_was_cancelled(workers_server: ShardqServer) -> None:
    server = workers_server
    queue = _queue_on(1, "cancel")
    back = _settled(server)["handedBack"]
    _fill(server, queue, AFTER + 1)
    raw = _handed_worker(server, queue)
    try:
        (job,) = _pull(raw, queue, 1)["jobs"]
        reply = _call(server, {"cmd": "Cancel", "id": job["id"], "active": True, "reason": "r"})
        assert reply["ok"] is True, reply
        (notice,) = raw.replies(1)  # unasked
        assert notice == {"type": "cancel", "jobId": job["id"], "queue": queue,
                          "reason": notice.get("reason")}, notice  # fmt: skip
        assert "r" in str(notice["reason"])
        assert _stats(server)["handedBack"] == back  # written by the shard holding it
    finally:
        raw.sock.close()


def test_kill9_of_the_shard_holding_a_worker_loses_nothing_acknowledged(
    shardq_server: Factory,
) -> None:
    server = _started(shardq_server)
    queue = _queue_on(1, "kill")
    jobs = [{"name": "w", "data": {"n": i}} for i in range(30)]
    assert _call(server, {"cmd": "PUSHB", "queue": queue, "jobs": jobs, "durable": True})["ok"]
    raw = _handed_worker(server, queue)
    try:
        # Acked through the shard, then committed (the flush window is milliseconds).
        _worker_round(raw, queue, 6, "acked")
        held = _pull(raw, queue, 5)["jobs"]
        assert len(held) == 5
        time.sleep(0.5)
        old = server.child_pids()["shard-1"]
        os.kill(old, signal.SIGKILL)
        raw.sock.settimeout(WAIT_S)
        with contextlib.suppress(ConnectionResetError):
            assert raw.sock.recv(65536) == b""  # the connection ends with its shard
        server.wait_child_replaced("shard-1", old)
    finally:
        raw.sock.close()
    acked = AFTER + 6
    # The leased jobs come back (active at a crash: one attempt more).
    poll_until(lambda: _counts(server, queue)["active"] == 0, WAIT_S, "the leases back")
    counts = _counts(server, queue)
    # Waiting, or delayed by the retry backoff of an attempt lost in a crash.
    back = counts["waiting"] + counts["delayed"]
    assert (back, counts["completed"], counts["failed"]) == (30 - acked, acked, 0), counts
    for job in held:
        got = _call(server, {"cmd": "GetJob", "id": job["id"]})["job"]
        assert got["attempts"] == 1, got


def test_a_long_poll_waiting_in_the_front_end_is_answered_empty_at_the_handoff(
    workers_server: ShardqServer,
) -> None:
    """A long-poll parked in the front end would hold the connection there (it is not read
    while it is handed off): the front end has it answered at once, empty, as its timeout
    would (`unpark`), and the connection goes to its shard, where the next pull is served."""
    server = workers_server
    empty, pushed = _queue_on(1, "idle"), _queue_on(1, "busy")
    settled = _settled(server)
    raw = _Raw(server)
    try:
        raw.send([{"cmd": "PULLB", "queue": empty, "count": 1, "timeout": 60_000, "reqId": "lp"}])
        time.sleep(0.3)  # parked
        replies = []
        for i in range(2 * AFTER):
            replies += raw.call([{"cmd": "PUSH", "queue": pushed, "data": i, "reqId": i}])
        missing = 2 * AFTER + 1 - len(replies)  # one reply a request: the long-poll's too
        if missing > 0:
            replies += raw.replies(missing)
        by_req = {r["reqId"]: r for r in replies}
        assert by_req.pop("lp") == {"ok": True, "jobs": [], "reqId": "lp"}
        assert sorted(by_req) == list(range(2 * AFTER))
        assert all(r["ok"] is True for r in by_req.values())
        poll_until(
            lambda: _stats(server)["handedOff"] == settled["handedOff"] + 1, WAIT_S, "the handoff"
        )
        _fill(server, empty, 1)
        (polled,) = raw.call([{"cmd": "PULLB", "queue": empty, "count": 1, "timeout": 5_000}])
        assert len(polled["jobs"]) == 1
        stats = _stats(server)
        got = (stats[k] - settled[k] for k in ("directPulled", "handedBack"))
        assert tuple(got) == (1, 0), (stats, settled)
    finally:
        raw.sock.close()


def test_a_connection_with_a_job_wait_in_the_front_end_stays_there(
    workers_server: ShardqServer,
) -> None:
    """A WaitJob parked in the front end is not a long-poll `unpark` answers: handing the
    connection off would stop reading it until the wait ends, and the pushes behind it would
    wait as long."""
    server = workers_server
    pushed = _queue_on(1, "waitq")
    off = _settled(server)["handedOff"]
    job_id = _call(server, {"cmd": "PUSH", "queue": pushed, "data": 0})["id"]
    raw = _Raw(server)
    try:
        raw.send([{"cmd": "WaitJob", "id": job_id, "timeout": 60_000, "reqId": "wait"}])
        for i in range(2 * AFTER):
            (reply,) = raw.call([{"cmd": "PUSH", "queue": pushed, "data": i, "reqId": i}])
            assert reply["ok"] is True and reply["reqId"] == i, reply
        assert _stats(server)["handedOff"] == off
    finally:
        raw.sock.close()


def _big_pull(server: ShardqServer, queue: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """Ten 300 KB jobs, a handoff, then one PULLB of all ten (3 MB, over a 1 MiB link): the
    jobs its reply carried, the queue's counts, and what it added to Stats' `handedOff` and
    `directPulled` and to Metrics' `totalPulled` (`pulled`)."""
    settled = _settled(server)
    was = _call(server, {"cmd": "Metrics"})["metrics"]["totalPulled"]
    jobs = [{"name": "big", "data": "b" * 300_000} for _ in range(10)]
    assert _call(server, {"cmd": "PUSHB", "queue": queue, "jobs": jobs})["ok"] is True
    raw = _Raw(server)
    try:
        # Small pushes for another queue of the shard earn the handoff (big ones would not:
        # a partial frame past `tcp_handoff_max_bytes` keeps the connection in the front end).
        pushes = [{"cmd": "PUSH", "queue": _queue_on(1, "cutx"), "data": i, "reqId": i}
                  for i in range(AFTER + 1)]  # fmt: skip
        assert all(r["ok"] for r in raw.call(pushes))
        time.sleep(0.3)  # a handoff, if any, has happened
        (reply,) = raw.call(
            [{"cmd": "PULLB", "queue": queue, "count": 10, "owner": "w", "reqId": "big"}]
        )
        assert reply["ok"] is True and reply["reqId"] == "big", reply
        assert len(reply["tokens"]) == len(reply["jobs"])
        counts = _call(server, {"cmd": "GetJobCounts", "queue": queue})["counts"]
        now = _stats(server)
        stats = {k: now[k] - settled[k] for k in ("handedOff", "directPulled")}
        stats["pulled"] = _call(server, {"cmd": "Metrics"})["metrics"]["totalPulled"] - was
        return len(reply["jobs"]), counts, stats
    finally:
        raw.sock.close()


def test_a_handed_off_pullb_too_large_for_the_link_is_cut_as_the_link_cuts_it(
    workers_server: ShardqServer, off_server: ShardqServer
) -> None:
    # With no link to cross, a handed-off connection's PULLB reply is still cut at
    # `link_max_frame_bytes`: a worker asking for more than that gets what fits, every time,
    # where a reply past the write backlog would cut its connection (and it would ask again).
    queue = _queue_on(1, "cut")
    handed = _big_pull(workers_server, queue)
    kept = _big_pull(off_server, queue)
    assert handed[2]["handedOff"] == 1 and kept[2]["handedOff"] == 0
    assert handed[2]["directPulled"] == handed[0] and kept[2]["directPulled"] == 0
    sent = handed[0]
    assert 0 < sent < 10 and sent == kept[0]
    # The others are back to waiting, not active with no worker holding them.
    for _, counts, stats in (handed, kept):
        assert counts["waiting"] == 10 - sent and counts["active"] == sent, counts
        assert stats["pulled"] == sent
