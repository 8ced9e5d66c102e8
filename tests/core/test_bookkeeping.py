"""What cron, group and limit bookkeeping costs per operation, counted as work rather than time.

A group's settings change writes one row, the same size whether its queue has one configured
group or thousands; a tick with 10,000 schedules of which none is due looks at one heap entry;
a schedule redefined over and over keeps its heap bounded. The values that once stayed in
memory and broke `CronList` and `GetQueueLimits` for every client are refused and leave nothing
behind.
"""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest

from shardq.core import Engine, EngineConfig, Mutation, fold_mutations
from shardq.protocol._fields import MAX_DURATION_MS

NOW = 1_700_000_000_000


def _apply(engine: Engine, cmd: dict[str, Any], now: int = NOW) -> tuple[Any, list[Mutation]]:
    reply, muts = (outcome := engine.apply(cmd, now)).reply, outcome.mutations
    return reply, list(muts)


def _size(muts: list[Mutation]) -> int:
    return sum(len(msgpack.packb(list(m), use_bin_type=True)) for m in muts)


def _configure(engine: Engine, count: int, muts: list[Mutation]) -> None:
    for i in range(count):
        for cmd in (
            {"cmd": "PauseGroup", "queue": "q", "groupId": f"g{i:05d}"},
            {"cmd": "SetGroupConcurrency", "queue": "q", "groupId": f"g{i:05d}", "concurrency": 2},
        ):
            reply, out = _apply(engine, cmd)
            assert reply["ok"], reply
            muts.extend(out)


def _pause_cost(groups: int) -> list[Mutation]:
    engine, muts = Engine(seed=1), list[Mutation]()
    _configure(engine, groups, muts)
    reply, out = _apply(engine, {"cmd": "PauseGroup", "queue": "q", "groupId": "new"})
    assert reply == {"ok": True, "data": {"changed": True}}
    return out


def test_a_group_update_writes_one_row_whatever_the_number_of_groups() -> None:
    alone, among = _pause_cost(0), _pause_cost(3_000)
    assert alone == [("group", "q", "new", {"paused": True, "until": 0})]
    assert among == alone
    assert _size(among) == _size(alone) < 100


def test_group_rows_fold_back_into_the_same_settings() -> None:
    engine, muts = Engine(seed=1), list[Mutation]()
    _configure(engine, 3, muts)
    for cmd in (
        {"cmd": "ResumeGroup", "queue": "q", "groupId": "g00000"},  # concurrency stays
        {"cmd": "ResumeGroup", "queue": "q", "groupId": "g00001"},
        {"cmd": "RemoveGroupConcurrency", "queue": "q", "groupId": "g00001"},  # nothing left
        {"cmd": "SetGroupRateLimit", "queue": "q", "groupId": "g00002", "max": 3, "duration": 50},
    ):
        reply, out = _apply(engine, cmd)
        assert reply["ok"], reply
        assert len(out) == 1 and out[0][:3] in {("group", "q", cmd["groupId"])} | {
            ("groupdel", "q", cmd["groupId"])
        }
        muts.extend(out)
    assert muts[-2] == ("groupdel", "q", "g00001")
    _, queues = fold_mutations(muts)
    assert set(queues["q"]["groups"]) == {"g00000", "g00002"}
    again = Engine(seed=1)
    again.restore([], queues, NOW)

    def view(e: Engine, gid: str) -> tuple[Any, ...]:
        ask = {"queue": "q", "groupId": gid}
        return (
            _apply(e, {"cmd": "IsGroupPaused", **ask})[0]["data"],
            _apply(e, {"cmd": "GetGroupConcurrency", **ask})[0]["data"],
            _apply(e, {"cmd": "GetGroupRateLimit", **ask})[0]["data"],
        )

    for gid in ("g00000", "g00001", "g00002"):
        assert view(again, gid) == view(engine, gid)
    assert view(again, "g00002")[1:] == ({"concurrency": 2}, {"limit": {"max": 3, "duration": 50}})
    assert again.queues["q"].groups is not None
    assert again.queues["q"].groups.configured_count() == 2


def test_obliterate_drops_the_groups_of_the_queue_from_the_fold() -> None:
    engine, muts = Engine(seed=1), list[Mutation]()
    _configure(engine, 2, muts)
    muts.extend(_apply(engine, {"cmd": "Obliterate", "queue": "q"})[1])
    assert "q" not in fold_mutations(muts)[1]


def test_the_configured_group_cap_counts_without_walking_and_frees_lapsed_deadlines() -> None:
    engine = Engine(EngineConfig(max_configured_groups=2), seed=1)
    assert _apply(engine, {"cmd": "PauseGroup", "queue": "q", "groupId": "a"})[0]["ok"]
    lapse = {"cmd": "RateLimitGroup", "queue": "q", "groupId": "b", "duration": 10}
    assert _apply(engine, lapse)[0]["ok"]
    third = {"cmd": "PauseGroup", "queue": "q", "groupId": "c"}
    refused, out = _apply(engine, third, NOW + 5)
    assert refused == {"ok": False, "error": "Too many configured groups in queue q (max 2)"}
    assert out == []
    # b's deadline has passed: it holds no setting any more, so c takes its place.
    assert _apply(engine, third, NOW + 11)[0]["ok"]
    table = engine.queues["q"].groups
    assert table is not None and table.configured_ids == {"a", "c"}


class _CountingDict(dict[str, Any]):
    """The schedule table, counting every look-up the engine makes in it."""

    lookups = 0

    def get(self, key: str, default: Any = None) -> Any:
        _CountingDict.lookups += 1
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        _CountingDict.lookups += 1
        return super().__getitem__(key)


def test_a_tick_with_ten_thousand_schedules_examines_only_the_due_ones() -> None:
    engine = Engine(seed=1)
    for i in range(10_000):
        cmd = {"cmd": "Cron", "name": f"c{i:05d}", "queue": "cq", "repeatEvery": 60_000}
        assert _apply(engine, cmd)[0]["ok"]
    one = {"cmd": "Cron", "name": "every-second", "queue": "cq", "repeatEvery": 1_000}
    assert _apply(engine, one)[0]["ok"]
    engine.cron.schedules = _CountingDict(engine.cron.schedules)

    _CountingDict.lookups = 0
    _, out = engine.tick(NOW + 500)  # nothing is due
    assert (out, _CountingDict.lookups) == ([], 1)
    assert engine.next_deadline() == NOW + 1_000

    _CountingDict.lookups = 0
    _, out = engine.tick(NOW + 1_000)  # only the every-second schedule is due
    crons = [m for m in out if m[0] == "cron"]
    assert [m[1] for m in crons] == ["every-second"]
    assert [m for m in out if m[0] == "put"] != []
    assert _CountingDict.lookups <= 4
    assert len(engine.cron.heap) <= 10_001 + 1


def test_redefining_a_schedule_keeps_its_heap_bounded() -> None:
    engine = Engine(seed=1)
    for i in range(5_000):
        every = 1_000 + i  # each redefinition moves the next slot: a new heap entry
        cmd = {"cmd": "Cron", "name": "c", "queue": "cq", "repeatEvery": every}
        assert _apply(engine, cmd, NOW + i)[0]["ok"]
    assert len(engine.cron.schedules) == 1
    assert len(engine.cron.heap) <= 2 * 1 + 64 + 1
    assert engine.next_deadline() == engine.cron.schedules["c"]["nextRun"]


BAD_SCHEDULES = [
    ({"repeatEvery": 1e300}, "Invalid repeatEvery: must be at most"),
    ({"repeatEvery": 2**64}, "Invalid repeatEvery: must be at most"),
    ({"repeatEvery": 1_000, "maxLimit": 1e300}, "Invalid maxLimit: must be at most"),
    ({"repeatEvery": 1_000, "maxLimit": 2**64}, "Invalid maxLimit: must be at most"),
    (
        {"schedule": "*/99999999999999999999 * * * *"},
        "Invalid schedule: step 99999999999999999999 of the minute field",
    ),
    ({"schedule": "0 */25 * * *"}, "Invalid schedule: step 25 of the hour field"),
    ({"schedule": "*/61 * * * * *"}, "Invalid schedule: step 61 of the second field"),
]


@pytest.mark.parametrize(("fields", "error"), BAD_SCHEDULES)
def test_a_schedule_that_would_break_reads_is_refused_and_not_kept(
    fields: dict[str, Any], error: str
) -> None:
    engine = Engine(seed=1)
    reply, out = _apply(engine, {"cmd": "Cron", "name": "bad", "queue": "q", **fields})
    assert reply["ok"] is False and reply["error"].startswith(error), reply
    assert out == [] and engine.cron.schedules == {}
    listed = _apply(engine, {"cmd": "CronList"})[0]
    assert listed == {"ok": True, "crons": []}
    msgpack.packb(listed)


def test_a_schedule_at_the_bounds_is_kept_and_encodes() -> None:
    engine = Engine(seed=1)
    # The schema's bound on a duration (bunqueue's clamp) comes before the engine's own
    # (now + every within 2^53 - 1 ms), so the longest accepted interval is the schema's.
    every = MAX_DURATION_MS
    assert NOW + every <= 2**53 - 1
    cmd = {"cmd": "Cron", "name": "far", "queue": "q", "repeatEvery": every, "maxLimit": 2**53 - 1}
    assert _apply(engine, cmd)[0]["ok"]
    step = {"cmd": "Cron", "name": "steps", "queue": "q", "schedule": "*/60 */24 * * *"}
    assert _apply(engine, step)[0]["ok"]
    listed = _apply(engine, {"cmd": "CronList"})[0]
    assert [c["name"] for c in listed["crons"]] == ["far", "steps"]
    msgpack.packb(listed)


BAD_LIMITS = [
    ({"cmd": "RateLimit", "limit": 1e300}, "Invalid limit: must be at most 9007199254740991"),
    ({"cmd": "RateLimit", "limit": 2**64}, "Invalid limit: must be at most 9007199254740991"),
    ({"cmd": "RateLimit", "limit": 5, "duration": 1e300}, "Invalid duration: must be at most"),
    ({"cmd": "RateLimit", "limit": 5, "ttl": 2**64}, "Invalid ttl: must be at most"),
    ({"cmd": "SetConcurrency", "limit": 1e300}, "Invalid limit: must be at most 9007199254740991"),
    ({"cmd": "SetConcurrency", "limit": 2**64}, "Invalid limit: must be at most 9007199254740991"),
    ({"cmd": "RateLimitGroup", "groupId": "g", "duration": 2**53 - 1}, "Invalid duration"),
]


@pytest.mark.parametrize(("cmd", "error"), BAD_LIMITS)
def test_a_limit_that_would_break_reads_is_refused_and_not_kept(
    cmd: dict[str, Any], error: str
) -> None:
    engine = Engine(seed=1)
    assert _apply(engine, {"cmd": "SetConcurrency", "queue": "q", "limit": 3})[0]["ok"]
    reply, out = _apply(engine, {**cmd, "queue": "q"})
    assert reply["ok"] is False and reply["error"].startswith(error), reply
    assert out == []
    limits = _apply(engine, {"cmd": "GetQueueLimits", "queue": "q"})[0]
    assert limits["data"]["limits"]["concurrencyLimit"] == 3
    assert limits["data"]["limits"]["rateLimit"] is None
    msgpack.packb(limits)
    assert _apply(engine, {"cmd": "IsGroupPaused", "queue": "q", "groupId": "g"})[0]["ok"]


def test_a_repeat_option_with_an_absurd_step_is_refused() -> None:
    engine = Engine(seed=1)
    push = {"cmd": "PUSH", "queue": "q", "data": {}, "repeat": {"pattern": "*/999999 * * * *"}}
    reply, out = _apply(engine, push)
    assert reply["ok"] is False and reply["error"].startswith("Invalid repeat.pattern: step")
    assert out == []


def test_held_back_groups_cost_unrelated_commands_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, groups = Engine(seed=1), 3_000
    for i in range(groups):
        cap = {"cmd": "SetGroupConcurrency", "queue": "q", "groupId": f"g{i}", "concurrency": 1}
        assert _apply(engine, cap)[0]["ok"]
    jobs = [{"data": {}, "groupId": f"g{i}"} for i in range(groups) for _ in range(2)]
    assert _apply(engine, {"cmd": "PUSHB", "queue": "q", "jobs": jobs})[0]["ok"]
    pull = {"cmd": "PULLB", "queue": "q", "count": 1000, "owner": "w"}
    taken = []
    for _ in range(3):
        reply = _apply(engine, pull)[0]
        taken += list(zip([j["id"] for j in reply["jobs"]], reply["tokens"], strict=True))
    assert len(taken) == groups  # one per group: every group is at its cap
    assert _apply(engine, pull)[0]["jobs"] == []  # skips them all: all are held back
    table = engine.queues["q"].groups
    assert table is not None and len(table.blocked) == groups

    calls = 0
    wakes_at = type(next(iter(table.groups.values()))).wakes_at

    def counted(self: Any, now: int) -> int | None:
        nonlocal calls
        calls += 1
        return wakes_at(self, now)

    monkeypatch.setattr(type(next(iter(table.groups.values()))), "wakes_at", counted)
    for _ in range(50):
        assert _apply(engine, {"cmd": "Count", "queue": "other"})[0]["ok"]
        engine.next_deadline()
        engine.tick(NOW + 1)
    assert calls == 0
    job_id, token = taken[0]
    events = engine.apply({"cmd": "ACK", "id": job_id, "token": token}, NOW).events
    assert ("ready", "q", "") in events  # the freed slot wakes parked pulls
    assert calls <= 2 and len(table.blocked) == groups - 1


def test_held_back_limited_queues_cost_unrelated_commands_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardq.core._queue_limits import QueueLimits

    engine, queues = Engine(seed=1), 2_000
    tokens = {}
    for i in range(queues):
        name = f"q{i}"
        limit = (
            {"cmd": "SetConcurrency", "queue": name, "limit": 1}
            if i % 2
            else {"cmd": "RateLimit", "queue": name, "limit": 1, "duration": 60_000}
        )
        assert _apply(engine, limit)[0]["ok"]
        push = {"cmd": "PUSHB", "queue": name, "jobs": [{"data": {}}] * 2}
        assert _apply(engine, push)[0]["ok"]
        pull = {"cmd": "PULLB", "queue": name, "count": 2, "owner": "w", "lockTtl": 600_000}
        reply = _apply(engine, pull)[0]
        assert len(reply["jobs"]) == 1  # held back by its limit
        tokens[name] = (reply["jobs"][0]["id"], reply["tokens"][0])
    assert len(engine.limiter.blocked) == queues
    assert engine.next_deadline() == NOW + 60_000

    calls = 0
    reopens_at = QueueLimits.reopens_at

    def counted(self: QueueLimits) -> int | None:
        nonlocal calls
        calls += 1
        return reopens_at(self)

    monkeypatch.setattr(QueueLimits, "reopens_at", counted)
    for _ in range(50):
        assert _apply(engine, {"cmd": "Count", "queue": "other"})[0]["ok"]
        engine.next_deadline()
        engine.tick(NOW + 1)
    assert calls == 0
    job_id, token = tokens["q1"]  # concurrency-capped: its ACK frees the slot
    events = engine.apply({"cmd": "ACK", "id": job_id, "token": token}, NOW).events
    assert events.count(("ready", "q1", "")) == 1
    assert "q1" not in engine.limiter.blocked
    events, _ = engine.tick(NOW + 60_000)  # every rate window reopens at once
    assert sorted(name for kind, name, _ in events if kind == "ready") == sorted(
        f"q{i}" for i in range(0, queues, 2)
    )


def test_slots_due_together_are_handled_a_bounded_lot_per_tick() -> None:
    engine = Engine(EngineConfig(max_cron_fires_per_tick=100), seed=1)
    for i in range(250):
        cmd = {"cmd": "Cron", "name": f"c{i:03d}", "queue": "cq", "repeatEvery": 1_000}
        assert _apply(engine, cmd)[0]["ok"]
    fired = []
    for _ in range(3):
        assert engine.next_deadline() == NOW + 1_000  # still due: tick again at once
        _, out = engine.tick(NOW + 1_000)
        fired.append(len([m for m in out if m[0] == "cron"]))
    assert fired == [100, 100, 50]
    assert engine.next_deadline() == NOW + 2_000
    counts = _apply(engine, {"cmd": "GetJobCounts", "queue": "cq"}, NOW + 1_000)[0]
    assert counts["counts"]["waiting"] == 250  # every slot fired once


def test_a_woken_queue_leaves_no_deadline_behind() -> None:
    """A queue held back until 1,000, then given a shorter window and held back until 100, is
    woken at 100: the entry for 1,000 is stale and must not stay a deadline (past its time
    it would make the shard tick at once, for ever)."""
    engine = Engine(seed=1)
    limit = {"cmd": "RateLimit", "queue": "q", "limit": 1, "duration": 1_000}
    assert _apply(engine, limit)[0]["ok"]
    assert _apply(engine, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": {}}] * 6})[0]["ok"]
    pull = {"cmd": "PULLB", "queue": "q", "count": 3, "owner": "w", "lockTtl": 600_000}
    assert len(_apply(engine, pull, NOW)[0]["jobs"]) == 1  # held back until NOW + 1,000
    assert _apply(engine, {**limit, "duration": 100}, NOW + 10)[0]["ok"]
    assert _apply(engine, pull, NOW + 20)[0]["jobs"] == []  # held back until NOW + 100
    events, _ = engine.tick(NOW + 100)
    assert ("ready", "q", "") in events and "q" not in engine.limiter.blocked
    assert engine.next_deadline() == NOW + 600_000  # the leases; no stale reopen time


def test_paused_groups_leave_the_ring_until_resumed() -> None:
    engine = Engine(seed=1)
    for i in range(2_000):
        assert _apply(engine, {"cmd": "PauseGroup", "queue": "q", "groupId": f"p{i}"})[0]["ok"]
    jobs = [{"data": {"g": i}, "groupId": f"p{i}"} for i in range(2_000)]
    jobs.append({"data": {"g": "open"}, "groupId": "open"})
    assert _apply(engine, {"cmd": "PUSHB", "queue": "q", "jobs": jobs})[0]["ok"]
    table = engine.queues["q"].groups
    assert table is not None and list(table.ring) == ["open"]  # paused ones never joined
    pull = {"cmd": "PULLB", "queue": "q", "count": 5, "owner": "w"}
    assert [j["data"]["g"] for j in _apply(engine, pull)[0]["jobs"]] == ["open"]
    assert _apply(engine, {"cmd": "ResumeGroup", "queue": "q", "groupId": "p7"})[0]["ok"]
    assert list(table.ring) == ["p7"]
    assert [j["data"]["g"] for j in _apply(engine, pull)[0]["jobs"]] == [7]
    # Paused while in the ring: the first pull that meets it takes it out.
    assert _apply(engine, {"cmd": "ResumeGroup", "queue": "q", "groupId": "p8"})[0]["ok"]
    assert _apply(engine, {"cmd": "PauseGroup", "queue": "q", "groupId": "p8"})[0]["ok"]
    assert _apply(engine, pull)[0]["jobs"] == [] and list(table.ring) == []
