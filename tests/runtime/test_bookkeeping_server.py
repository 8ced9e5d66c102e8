"""Cron, group and limit bookkeeping on the real server (`shardq start --shards 2`).

- Schedule and limit values that once stayed in memory and broke `CronList`, `GET /crons` and
  `GetQueueLimits` for every client are refused over TCP with `Invalid <field>: <why>`, and
  those reads keep working afterwards.
- Hundreds of configured groups (one stored row each since schema version 7) and schedules
  survive a SIGTERM restart and a `kill -9` of the whole tree. Settings are buffered writes:
  a durable push on the same queue, acknowledged after them, proves they were committed.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer, free_port

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
WAIT_S = 30.0
GROUPS = 300

BAD: list[tuple[dict[str, Any], str]] = [
    ({"cmd": "Cron", "name": "b1", "queue": "cq", "repeatEvery": 1e300}, "Invalid repeatEvery"),
    ({"cmd": "Cron", "name": "b2", "queue": "cq", "repeatEvery": 2.0**64}, "Invalid repeatEvery"),
    ({"cmd": "Cron", "name": "b3", "queue": "cq", "repeatEvery": 2**64 - 1}, "Invalid repeatEvery"),
    (
        {"cmd": "Cron", "name": "b4", "queue": "cq", "repeatEvery": 1000, "maxLimit": 1e300},
        "Invalid maxLimit",
    ),
    (
        {"cmd": "Cron", "name": "b5", "queue": "cq", "schedule": "*/99999999999999999999 * * * *"},
        "Invalid schedule",
    ),
    ({"cmd": "RateLimit", "queue": "lq", "limit": 1e300}, "Invalid limit"),
    ({"cmd": "RateLimit", "queue": "lq", "limit": 2.0**64}, "Invalid limit"),
    ({"cmd": "RateLimit", "queue": "lq", "limit": 2**64 - 1}, "Invalid limit"),
    ({"cmd": "RateLimit", "queue": "lq", "limit": 5, "duration": 1e300}, "Invalid duration"),
    ({"cmd": "SetConcurrency", "queue": "lq", "limit": 1e300}, "Invalid limit"),
    ({"cmd": "SetConcurrency", "queue": "lq", "limit": 2.0**64}, "Invalid limit"),
]


def _connect(server: ShardqServer) -> TcpConnection:
    return TcpConnection(*server.tcp_address, timeout=WAIT_S)


def _http_crons(server: ShardqServer) -> tuple[int, Any]:
    with urllib.request.urlopen(server.http_url + "/crons", timeout=WAIT_S) as r:
        return r.status, json.loads(r.read())


def test_values_that_would_break_reads_are_refused_and_reads_keep_working(
    shardq_server: Factory,
) -> None:
    server = shardq_server(shards=2, http_port=free_port())
    with _connect(server) as conn:
        good = {"cmd": "Cron", "name": "good", "queue": "cq", "repeatEvery": 60_000}
        assert conn.call(good)["ok"]
        assert conn.call({"cmd": "SetConcurrency", "queue": "lq", "limit": 4})["ok"]
        replies = conn.call_many([cmd for cmd, _ in BAD], check=False)
        for (cmd, error), reply in zip(BAD, replies, strict=True):
            assert reply["ok"] is False, (cmd, reply)
            assert reply["error"].startswith(error + ": "), (cmd, reply)
        # Every client still reads the schedules and the limits, as they were.
        for _ in range(2):
            with _connect(server) as other:
                listed = other.call({"cmd": "CronList"})["crons"]
                assert [c["name"] for c in listed] == ["good"]
                limits = other.call({"cmd": "GetQueueLimits", "queue": "lq"})["data"]["limits"]
                assert (limits["concurrencyLimit"], limits["rateLimit"]) == (4, None)
        status, body = _http_crons(server)
        assert status == 200 and "good" in json.dumps(body)
        assert "b1" not in json.dumps(body)
    assert server.stop() == 0


def _configure(conn: TcpConnection) -> None:
    commands: list[dict[str, Any]] = []
    for i in range(GROUPS):
        base = {"queue": "gq", "groupId": f"g{i:04d}"}
        commands.append({"cmd": "PauseGroup", **base})
        commands.append({"cmd": "SetGroupConcurrency", **base, "concurrency": 1 + i % 3})
    for i in range(0, GROUPS, 10):
        commands.append({"cmd": "ResumeGroup", "queue": "gq", "groupId": f"g{i:04d}"})
    commands.append({"cmd": "Cron", "name": "hourly", "queue": "gq", "schedule": "0 * * * *"})
    # A queue whose only trace is one configured group: no job, no settings of its own.
    commands.append({"cmd": "PauseGroup", "queue": "bare", "groupId": "only"})
    for reply in conn.call_many(commands):
        assert reply["ok"], reply
    # Durable, after the settings on the same shard: once it is acknowledged they are stored.
    barrier = {"cmd": "PUSH", "queue": "gq", "data": {"barrier": True}, "durable": True}
    assert conn.call(barrier)["ok"]


def _check(conn: TcpConnection) -> None:
    asks: list[dict[str, Any]] = []
    for i in range(GROUPS):
        base = {"queue": "gq", "groupId": f"g{i:04d}"}
        asks += [{"cmd": "IsGroupPaused", **base}, {"cmd": "GetGroupConcurrency", **base}]
    replies = conn.call_many(asks)
    for i in range(GROUPS):
        paused, cap = replies[2 * i]["data"], replies[2 * i + 1]["data"]
        assert paused == {"paused": i % 10 != 0}, (i, paused)
        assert cap == {"concurrency": 1 + i % 3}, (i, cap)
    assert [c["name"] for c in conn.call({"cmd": "CronList"})["crons"]] == ["hourly"]
    bare = conn.call({"cmd": "IsGroupPaused", "queue": "bare", "groupId": "only"})
    assert bare["data"] == {"paused": True}


def test_group_settings_and_schedules_survive_sigterm_and_kill_9(shardq_server: Factory) -> None:
    server = shardq_server(shards=2)
    with _connect(server) as conn:
        _configure(conn)
        _check(conn)
    assert server.stop() == 0
    server.start()
    with _connect(server) as conn:
        _check(conn)
        # Change a few after the restart, then kill -9 right after a durable barrier.
        more = [{"cmd": "ResumeGroup", "queue": "gq", "groupId": f"g{i:04d}"} for i in (1, 2)]
        more.append({"cmd": "RemoveGroupConcurrency", "queue": "gq", "groupId": "g0003"})
        for reply in conn.call_many(more):
            assert reply["ok"], reply
        barrier = {"cmd": "PUSH", "queue": "gq", "data": {"barrier": 2}, "durable": True}
        assert conn.call(barrier)["ok"]
    server.kill9_tree()
    server.start()
    with _connect(server) as conn:
        base = {"queue": "gq"}
        for gid, paused in (("g0001", False), ("g0002", False), ("g0004", True)):
            reply = conn.call({"cmd": "IsGroupPaused", **base, "groupId": gid})
            assert reply["data"] == {"paused": paused}, gid
        cap = conn.call({"cmd": "GetGroupConcurrency", **base, "groupId": "g0003"})
        assert cap["data"] == {"concurrency": None}
        assert conn.call({"cmd": "IsGroupPaused", **base, "groupId": "g0299"})["data"] == {
            "paused": True
        }
        assert [c["name"] for c in conn.call({"cmd": "CronList"})["crons"]] == ["hourly"]
    assert server.stop() == 0
