"""A registered worker's connection handed off (`tcp_handoff`, docs/runtime.md "Handed-off
connections"): the worker registry's commands (RegisterWorker, Heartbeat, UnregisterWorker)
are the front end's, and leave no state that keeps the connection there; the shard serves the
lease renewals (JobHeartbeat, JobHeartbeatB, ExtendLock, ExtendLocks) of the jobs it holds; a
hand-back for a registry command starts no back-off. The replies are the front end's, byte
for byte where no id, token or time lies in them.

Raw sockets against real servers, so that the bytes of each reply are the test's to compare.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from shardq_harness import ShardqServer
from test_handoff_frames import (
    AFTER,
    Factory,
    _queue_on,
    _Raw,
    _settled,
    _started,
    _stats,
    shared_server,
)
from test_handoff_workers import (
    _UUID_B,
    VOLATILE,
    _call,
    _fill,
    _handed_worker,
    _shape,
    _worker_round,
)

# A back-off no test waits out: a connection handed off again after a hand-back owes it to
# the registry's waiver.
LONG_BACKOFF = {"SHARDQ_TCP_HANDOFF_BACKOFF_MS": "600000"}
WORKER = "w-reg-1"
_COUNTED = ("handedOff", "handedBack", "directPulled", "directCompleted")


@pytest.fixture(scope="module")
def registry_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """Shared by the three tests (queues reg, lease and short; only the first registers a
    worker, and it unregisters it; each reads Stats' counts as differences): two server
    starts fewer. With `LONG_BACKOFF`: the lease test is never handed back, so a back-off
    changes nothing of it. The short-tokens test completes the job it renewed, which a
    closed connection leaves leased (docs/protocol.md, 2.6) and which would otherwise hold
    the clean stop for the whole shutdown timeout."""
    with shared_server(tmp_path_factory, "registry", LONG_BACKOFF) as server:
        yield server


def _volatile(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k in VOLATILE or _volatile(v) for k, v in value.items())
    if isinstance(value, list):
        return any(map(_volatile, value))
    return False


def _register(queue: str) -> dict[str, Any]:
    return {"cmd": "RegisterWorker", "name": "reg", "queues": [queue], "concurrency": 5,
            "workerId": WORKER, "hostname": "h", "pid": 7, "startedAt": 1000}  # fmt: skip


def _renewals(raw: _Raw, queue: str) -> list[bytes]:
    """Three jobs pulled, each renewal command on them (good, stale and missing tokens)."""
    raw.send([{"cmd": "PULLB", "queue": queue, "count": 3, "owner": WORKER, "lockTtl": 60_000,
               "reqId": "held"}])  # fmt: skip
    (pulled,) = raw.bodies(1)
    held = msgpack.unpackb(pulled, raw=False)
    ids, tokens = [j["id"] for j in held["jobs"]], held["tokens"]
    raw.send([{"cmd": "JobHeartbeat", "id": ids[0], "token": tokens[0], "reqId": "hb"},
              {"cmd": "JobHeartbeat", "id": ids[0], "token": "stale", "reqId": "hbstale"},
              {"cmd": "JobHeartbeatB", "ids": ids, "tokens": tokens, "reqId": "hbb"},
              {"cmd": "JobHeartbeatB", "ids": ids, "tokens": ["x", "y", "z"], "reqId": "hbbx"},
              {"cmd": "JobHeartbeatB", "ids": ids, "reqId": "hbbnone"},
              {"cmd": "ExtendLock", "id": ids[1], "token": tokens[1], "duration": 90_000,
               "reqId": "ext"},
              {"cmd": "ExtendLock", "id": ids[1], "token": "stale", "reqId": "extstale"},
              {"cmd": "ExtendLocks", "ids": ids, "tokens": tokens,
               "durations": [90_000, 80_000, 70_000], "reqId": "exts"},
              {"cmd": "ExtendLocks", "ids": ids, "tokens": [tokens[0], "y", "z"],
               "durations": [90_000, 1, 2], "reqId": "extsx"},
              {"cmd": "ACKB", "ids": ids, "tokens": tokens, "reqId": "done"},
              {"cmd": "JobHeartbeatB", "ids": ids, "tokens": tokens, "reqId": "hbbdone"},
              {"cmd": "JobHeartbeat", "id": ids[2], "token": tokens[2], "reqId": "hbdone"},
              ])  # fmt: skip
    return [pulled, *raw.bodies(12)]


def _script(server: ShardqServer, queue: str) -> tuple[list[bytes], dict[str, Any]]:
    """A registered worker's requests against `server`: the reply bodies, and what they
    added to Stats' `_COUNTED`."""
    settled = _settled(server)
    _fill(server, queue, 40)
    raw = _Raw(server)
    try:
        bodies = raw.call_bodies([_register(queue)])
        for r in range(AFTER):
            bodies += _worker_round(raw, queue, 2, f"r{r}")
        time.sleep(0.3)  # a handoff, if any, has happened
        bodies += _renewals(raw, queue)
        heartbeat = {"cmd": "Heartbeat", "id": WORKER, "activeJobs": 3, "processed": 11,
                     "failed": 1}  # fmt: skip
        bodies += raw.call_bodies([heartbeat, {"cmd": "ListWorkers"}])
        for r in range(AFTER):  # handed off again at once: a registry command came back
            bodies += _worker_round(raw, queue, 2, f"again{r}")
        time.sleep(0.3)
        bodies += _renewals(raw, queue)
        bodies += raw.call_bodies([{"cmd": "UnregisterWorker", "workerId": WORKER},
                                   {"cmd": "ListWorkers"},
                                   {"cmd": "UnregisterWorker", "workerId": WORKER}])  # fmt: skip
        now = _stats(server)
        return bodies, {k: now[k] - settled[k] for k in _COUNTED}
    finally:
        raw.sock.close()


def test_a_registered_workers_connection_is_handed_off_with_the_same_replies(
    registry_server: ShardqServer, shardq_server: Factory, tmp_path: Path
) -> None:
    queue = _queue_on(1, "reg")
    handed, handed_stats = _script(registry_server, queue)
    off = _started(shardq_server, {**LONG_BACKOFF, "SHARDQ_TCP_HANDOFF": "false"}, tmp_path / "off")
    kept, kept_stats = _script(off, queue)
    assert kept_stats["handedOff"] == 0 and kept_stats["directPulled"] == 0
    # Handed off after its first pulls; back for the Heartbeat, off again at once despite the
    # back-off; back for the UnregisterWorker (the waiver's once per back-off is spent). The
    # renewals never went back: the shard served them.
    assert (handed_stats["handedOff"], handed_stats["handedBack"]) == (2, 2), handed_stats
    # Each time, the rounds after the first two (the handoff's AFTER requests), and the renewals'.
    assert handed_stats["directPulled"] == 2 * (2 * (AFTER - 2) + 3), handed_stats
    assert handed_stats["directCompleted"] == handed_stats["directPulled"]
    replies = [msgpack.unpackb(b, raw=False) for b in handed]
    assert [_shape(r) for r in replies] == [_shape(msgpack.unpackb(b, raw=False)) for b in kept]
    for a, b, reply in zip(handed, kept, replies, strict=True):
        if not _volatile(reply) and not reply.get("jobs"):
            assert _UUID_B.sub(b"-" * 36, a) == _UUID_B.sub(b"-" * 36, b), reply
    by_req = {r.get("reqId"): r for r in replies}
    assert by_req["hbb"]["data"] == {"ok": True, "count": 3}
    assert by_req["hbbx"]["data"] == {"ok": True, "count": 0}
    assert by_req["hbstale"]["ok"] is False and by_req["extstale"]["ok"] is False
    assert by_req["exts"]["count"] == 3 and by_req["extsx"]["count"] == 1
    # The registry saw the Heartbeat's counters, and the worker is gone once unregistered.
    listed = [r for r in replies if "workers" in (r.get("data") or {})]
    assert [[w["id"] for w in r["data"]["workers"]] for r in listed] == [[WORKER], []]
    assert listed[0]["data"]["workers"][0]["processedJobs"] == 11


def test_a_handed_off_workers_renewals_keep_its_lease(registry_server: ShardqServer) -> None:
    server = registry_server
    queue = _queue_on(1, "lease")
    back = _settled(server)["handedBack"]
    _fill(server, queue, AFTER + 1)
    raw = _handed_worker(server, queue)
    try:
        completed = _stats(server)["directCompleted"]
        (got,) = raw.call([{"cmd": "PULLB", "queue": queue, "count": 1, "owner": WORKER,
                            "lockTtl": 1_000}])  # fmt: skip
        (job,), (token,) = got["jobs"], got["tokens"]
        # Three seconds, three lease lengths: renewed all along, in each form.
        renewals = [
            {"cmd": "JobHeartbeatB", "ids": [job["id"]], "tokens": [token]},
            {"cmd": "JobHeartbeat", "id": job["id"], "token": token},
            {"cmd": "ExtendLock", "id": job["id"], "token": token, "duration": 1_000},
            {"cmd": "ExtendLocks", "ids": [job["id"]], "tokens": [token], "durations": [1_000]},
        ]
        for i in range(12):
            (reply,) = raw.call([renewals[i % 4]])
            assert reply["ok"] is True, reply
            time.sleep(0.25)
        # Nobody else got it, and its worker's ACK is taken.
        assert _call(server, {"cmd": "PULLB", "queue": queue, "count": 1})["jobs"] == []
        (acked,) = raw.call([{"cmd": "ACK", "id": job["id"], "token": token}])
        assert acked["ok"] is True and (acked.get("data") or {}).get("applied") is not False
        stats = _stats(server)
        assert stats["handedBack"] == back and stats["directCompleted"] == completed + 1, stats
        job = _call(server, {"cmd": "GetJob", "id": job["id"]})["job"]
        assert job["attempts"] == 0  # its lease never lapsed
    finally:
        raw.sock.close()


def test_a_renewal_whose_tokens_do_not_line_up_goes_back_to_the_front_end(
    registry_server: ShardqServer,
) -> None:
    """A JobHeartbeatB with fewer tokens than ids is the front end's to answer (docs/runtime.md,
    "lease renewals"): the shard hands the connection back with it, and the reply is the one
    a connection the front end serves gets for the same command."""
    server = registry_server
    queue = _queue_on(1, "short")
    back = _settled(server)["handedBack"]
    _fill(server, queue, AFTER + 3)
    raw = _handed_worker(server, queue)
    try:
        (got,) = raw.call([{"cmd": "PULLB", "queue": queue, "count": 3, "owner": WORKER,
                            "lockTtl": 60_000}])  # fmt: skip
        short = {"cmd": "JobHeartbeatB", "ids": [j["id"] for j in got["jobs"]],
                 "tokens": got["tokens"][:1]}  # fmt: skip
        assert _stats(server)["handedBack"] == back
        (handed,) = raw.call([short])
        assert _stats(server)["handedBack"] == back + 1  # the shard did not serve it
        served = _call(server, short)  # a fresh connection: the front end's
        served.pop("reqId", None)
        assert handed == served, (handed, served)
        raw.sock.close()
        # The renewed job stays leased past its connection's close (docs/protocol.md, 2.6)
        # and would hold the server's clean stop for its whole drain: complete it.
        ack = {"cmd": "ACK", "id": got["jobs"][0]["id"], "token": got["tokens"][0]}
        assert _call(server, ack)["ok"]
    finally:
        raw.sock.close()
