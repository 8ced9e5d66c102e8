"""One bad request never stops a shard, and a mutation the writer rejects leaves no trace
(issue 10, section 3).

The first tests drive `ShardCore` turn by turn (as `test_shard_core.py` does); the last ones
send real bad requests to the real server and check that its shard process is still the one
that started.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from shardq_harness import ShardqServer
from structlog.testing import capture_logs
from test_shard_core import T0, Shard
from wire_clients import Tcp

from shardq.core import Engine
from shardq.protocol import INTERNAL_SERVER_ERROR
from shardq.runtime.links._control import unpack
from shardq.runtime.shard._core import TICK_RETRY_MS, ShardCore
from shardq.storage import put_keys

HUGE = 1e300  # int(1e300) fits no 64-bit field: msgpack, SQLite and poll all refuse it


@pytest.fixture
def s() -> Shard:
    return Shard()


def test_a_rejected_durable_push_is_answered_with_an_error_and_forgotten(s: Shard) -> None:
    (rid,) = s.turn({"cmd": "PUSH", "queue": "q", "data": 1, "durable": True})
    job_id = s.batches[0]["muts"][0][1]  # ("putb", row_key, ...)
    s.msg({"t": "rejected", "seq": 1, "items": [["put", job_id, "OverflowError: too big"]]})
    s.msg({"t": "done", "seq": 1})
    assert s.replies[rid]["ok"] is False and "Storage rejected" in s.replies[rid]["error"]
    assert s.core.engine.find(job_id) is None
    (pull,) = s.turn({"cmd": "PULL", "queue": "q"})
    assert s.replies[pull] == {"ok": True, "job": None}


def test_a_rejected_bulk_entry_fails_the_push_and_deletes_its_siblings(s: Shard) -> None:
    jobs = [{"data": n, "durable": True} for n in range(3)]
    (rid,) = s.turn({"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    keys = [key for m in s.batches[0]["muts"] for key in put_keys(m)]  # one `putm`
    assert len(keys) == 3
    s.msg({"t": "rejected", "seq": 1, "items": [["put", keys[1], "OverflowError"]]})
    s.msg({"t": "done", "seq": 1})
    assert s.replies[rid]["ok"] is False
    assert all(s.core.engine.find(k) is None for k in keys)
    # The two that were committed are deleted, so a retry of the push duplicates nothing.
    assert sorted(m[1] for m in s.batches[1]["muts"] if m[0] == "del") == sorted([keys[0], keys[2]])


def test_a_rejected_update_puts_the_stored_record_back(s: Shard) -> None:
    (rid,) = s.turn({"cmd": "PUSH", "queue": "q", "data": 1, "priority": 1})
    job_id = s.replies[rid]["id"]
    stored = dict(s.core.engine.find(job_id).to_record())  # type: ignore[union-attr]
    (change,) = s.turn({"cmd": "ChangePriority", "id": job_id, "priority": 9})
    assert s.replies[change]["ok"] and s.core.engine.find(job_id).priority == 9  # type: ignore[union-attr]
    s.msg({"t": "rejected", "seq": 2, "items": [["upd", job_id, "OverflowError", stored]]})
    assert s.core.engine.find(job_id).priority == 1  # type: ignore[union-attr]
    (pull,) = s.turn({"cmd": "PULL", "queue": "q"})
    assert s.replies[pull]["job"]["id"] == job_id  # still a working job


def test_a_push_that_cannot_be_encoded_fails_alone(s: Shard) -> None:
    good, bad, after = s.turn(
        {"cmd": "PUSH", "queue": "q", "data": "fine"},
        {"cmd": "PUSH", "queue": "q", "data": "poison", "jobId": "p1", "timestamp": HUGE},
        {"cmd": "PUSH", "queue": "q", "data": "fine too"},
    )
    assert s.replies[good]["ok"] and s.replies[after]["ok"]
    assert s.replies[bad]["ok"] is False
    assert s.core.engine.find("p1") is None
    # The two good puts went to the writer (as one `putm`: their columns are equal).
    assert [key for m in s.batches[0]["muts"] for key in put_keys(m)] == [
        s.replies[good]["id"],
        s.replies[after]["id"],
    ]


# -- the real server


def _still_serving(tcp: Tcp, tag: str) -> None:
    reply = tcp.call({"cmd": "PUSH", "queue": "ok", "data": tag, "durable": True})
    assert reply["ok"], reply


BAD_REQUESTS: list[dict[str, Any]] = [
    {"cmd": "PUSH", "queue": "bad", "data": 1, "timestamp": HUGE},
    {"cmd": "PUSH", "queue": "bad", "data": 1, "timestamp": -1.5e19},
    {"cmd": "PUSH", "queue": "bad", "data": 1, "uniqueKey": "u", "dedup": {"ttl": HUGE}},
    {"cmd": "PUSH", "queue": "bad", "data": 1, "delay": HUGE},
]


def test_bad_requests_fail_alone_and_the_shard_keeps_running(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=1)
    shard_pid = server.child_pids()["shard-0"]
    tcp = Tcp(server.tcp_address)
    _still_serving(tcp, "before")
    for n, bad in enumerate(BAD_REQUESTS):
        # In one write: a good push, the bad request, a good push. Only the bad one may fail.
        reqs = tcp.send(
            {"cmd": "PUSH", "queue": "ok", "data": n},
            bad,
            {"cmd": "PUSH", "queue": "ok", "data": n},
        )
        replies = [tcp.wait(r) for r in reqs]
        assert replies[0]["ok"] and replies[2]["ok"], (bad, replies)
        _still_serving(tcp, f"after {bad}")
    # A lease that ends past every clock: the pull works or fails, the shard lives on.
    tcp.call({"cmd": "PUSH", "queue": "lease", "data": 1})
    tcp.call({"cmd": "PULLB", "queue": "lease", "count": 1, "owner": "w", "lockTtl": HUGE})
    _still_serving(tcp, "after the lease")
    assert server.child_pids()["shard-0"] == shard_pid  # never restarted
    assert server.find_log("shard failed") is None
    tcp.close()
    assert server.stop() == 0


def test_a_reply_that_cannot_be_packed_fails_alone() -> None:
    from shardq.runtime.shard._salvage import salvage_replies
    from shardq.runtime.shard._wire import FrontPacker

    pack = FrontPacker().pack
    msg = {"t": "rep", "items": [["t1", 1, {"ok": True}], ["t1", 2, {"ok": True, "n": 2**70}]]}
    with pytest.raises(OverflowError):
        pack(msg)
    packed = pack(salvage_replies(msg, pack))
    assert unpack(packed)["items"] == [
        ["t1", 1, {"ok": True}],
        ["t1", 2, {"ok": False, "error": INTERNAL_SERVER_ERROR}],
    ]


class _TickFails(Engine):
    """An engine whose timer pass raises once, as a bug in a timer path would."""

    def __init__(self) -> None:
        super().__init__(seed=1)
        self.failures = 1

    def tick(self, now: int) -> Any:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("a bug in a timer path")
        return super().tick(now)


def test_a_timer_pass_that_raises_is_logged_and_retried_later() -> None:
    core = ShardCore(0, _TickFails())
    now = T0
    delayed = {"cmd": "PUSH", "queue": "q", "data": 1, "delay": 10}
    core.handle({"t": "req", "items": [["t1", 1, delayed]]}, now)
    core.finish_turn(now)
    with capture_logs() as logs:
        out = core.finish_turn(now + 20)  # the promotion is due: the tick raises
    assert any(line["event"] == "shard step failed" for line in logs)
    assert core.poll_timeout(now + 20) == TICK_RETRY_MS  # no busy loop on the failing timer
    ping = {"cmd": "GetJobCounts", "queue": "q"}
    core.handle({"t": "req", "items": [["t1", 2, ping]]}, now + 20)
    out = core.finish_turn(now + 20)
    assert out[-1][1]["items"][0][2]["counts"]["delayed"] == 1  # still answering
    core.finish_turn(now + 20 + TICK_RETRY_MS)  # the retry runs the promotion
    core.handle({"t": "req", "items": [["t1", 3, ping]]}, now + 20 + TICK_RETRY_MS)
    out = core.finish_turn(now + 20 + TICK_RETRY_MS)
    assert out[-1][1]["items"][0][2]["counts"]["waiting"] == 1
