"""Job groups in the engine: round-robin order, per-group caps, rate limits, pause, manual rate
limits and groupMaxSize; held-back pulls woken when a group gets room (a "ready" event, or a
deadline); settings survive a restore; queues without groups are untouched."""

from __future__ import annotations

from typing import Any

import pytest

from shardq.core import Engine, EngineConfig, Mutation, fold_mutations


class G:
    def __init__(self) -> None:
        self.engine = Engine(seed=1)
        self.muts: list[Mutation] = []
        self.events: list[tuple[str, str, str]] = []  # of the last command
        self.now = 1_000_000

    def cmd(self, **cmd: Any) -> dict[str, Any]:
        outcome = self.engine.apply(cmd, self.now)
        self.muts.extend(outcome.mutations)
        self.events = outcome.events
        return outcome.reply

    def push(self, group: str | None, label: str, **extra: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {"data": {"label": label}, **extra}
        if group is not None:
            fields["groupId"] = group
        return self.cmd(cmd="PUSH", queue="q", **fields)

    def pull(self, count: int = 10) -> list[dict[str, Any]]:
        return list(self.cmd(cmd="PULLB", queue="q", count=count, owner="w")["jobs"])

    def labels(self, count: int = 10) -> list[str]:
        return [job["data"]["label"] for job in self.pull(count)]

    def woken(self) -> bool:
        return any(kind == "ready" for kind, _, _ in self.events)

    def data(self, name: str, **fields: Any) -> Any:
        reply = self.cmd(cmd=name, queue="q", **fields)
        assert reply["ok"], reply
        return reply["data"]


def test_groups_take_turns_after_ungrouped_jobs() -> None:
    t = G()
    for i in range(3):
        t.push("A", f"A{i}")
    for i in range(3):
        t.push("B", f"B{i}")
    t.push(None, "plain")
    assert t.labels(4) == ["plain", "A0", "B0", "A1"]
    # the next pull starts after the group served last
    assert t.labels(10) == ["B1", "A2", "B2"]


def test_inside_a_group_lower_priority_comes_first() -> None:
    t = G()
    t.push("A", "late", priority=5)
    t.push("A", "first", priority=0)
    t.push("A", "second", priority=0)
    assert t.labels() == ["first", "second", "late"]


def test_group_concurrency_caps_active_jobs_and_an_ack_wakes_the_queue() -> None:
    t = G()
    for i in range(4):
        t.push("A", f"A{i}")
        t.push("B", f"B{i}")
    assert t.cmd(cmd="SetGroupConcurrency", queue="q", groupId="A", concurrency=1) == {"ok": True}
    first = t.pull(10)
    assert [j["data"]["label"] for j in first] == ["A0", "B0", "B1", "B2", "B3"]
    assert t.data("GetGroupActiveCount", groupId="A") == {"count": 1}
    assert t.pull() == []
    assert t.engine.groups.blocked == {"q"}
    reply = t.cmd(cmd="ACK", id=first[0]["id"], token=_token(t, first[0]["id"]))
    assert reply["ok"]
    assert t.woken()
    assert t.labels() == ["A1"]
    assert t.data("GetGroupConcurrency", groupId="A") == {"concurrency": 1}
    assert t.data("RemoveGroupConcurrency", groupId="A") == {"removed": 1}
    assert t.woken()
    assert t.data("RemoveGroupConcurrency", groupId="A") == {"removed": 0}
    assert t.labels() == ["A2", "A3"]


def _token(t: G, job_id: str) -> str:
    assert job_id in t.engine.store.leases
    token = t.engine.jobs[job_id].token
    assert token is not None
    return token


def test_group_rate_limit_sets_a_deadline_and_reopens() -> None:
    t = G()
    for i in range(5):
        t.push("A", f"A{i}")
    t.cmd(cmd="SetGroupRateLimit", queue="q", groupId="A", max=2, duration=1000)
    assert t.data("GetGroupRateLimit", groupId="A") == {"limit": {"max": 2, "duration": 1000}}
    assert t.labels() == ["A0", "A1"]
    assert t.labels() == []
    assert t.data("GetGroupRateLimitTtl", groupId="A") == {"ttl": 1000}
    table = t.engine.queues["q"].groups
    assert table is not None and table.next_wake() == t.now + 1000
    events, _ = t.engine.tick(t.now + 999)
    assert not any(kind == "ready" for kind, _, _ in events)
    t.now += 1000
    events, _ = t.engine.tick(t.now)
    assert ("ready", "q", "") in events
    assert t.labels() == ["A2", "A3"]
    assert t.data("RemoveGroupRateLimit", groupId="A") == {"removed": 1}
    assert t.data("GetGroupRateLimit", groupId="A") == {"limit": None}
    assert t.labels() == ["A4"]


def test_pause_and_resume_a_group() -> None:
    t = G()
    t.push("A", "A0")
    t.push("B", "B0")
    assert t.data("PauseGroup", groupId="A") == {"changed": True}
    assert t.data("PauseGroup", groupId="A") == {"changed": False}
    assert t.data("IsGroupPaused", groupId="A") == {"paused": True}
    assert t.labels() == ["B0"]
    assert t.labels() == []
    assert t.data("ResumeGroup", groupId="A") == {"changed": True}
    assert t.woken()
    assert t.data("ResumeGroup", groupId="A") == {"changed": False}
    assert t.data("IsGroupPaused", groupId="A") == {"paused": False}
    assert t.labels() == ["A0"]


def test_rate_limit_group_holds_a_group_until_its_deadline() -> None:
    t = G()
    t.push("A", "A0")
    assert t.data("GetGroupRateLimitTtl", groupId="A") == {"ttl": -2}
    assert t.cmd(cmd="RateLimitGroup", queue="q", groupId="A", duration=5000) == {"ok": True}
    assert t.data("GetGroupRateLimitTtl", groupId="A") == {"ttl": 5000}
    assert t.labels() == []
    t.now += 5000
    events, _ = t.engine.tick(t.now)
    assert ("ready", "q", "") in events
    assert t.labels() == ["A0"]


def test_group_max_size_refuses_a_push_over_the_cap() -> None:
    t = G()
    assert t.push("A", "1", groupMaxSize=2)["ok"]
    assert t.push("A", "2", groupMaxSize=2)["ok"]
    reply = t.push("A", "3", groupMaxSize=2)
    assert reply == {"ok": False, "error": "Group A has reached its maximum size of 2"}
    assert t.push("B", "b", groupMaxSize=2)["ok"]
    bad = t.push("C", "c", groupMaxSize=0)
    assert bad == {"ok": False, "error": "groupMaxSize must be a positive integer"}
    jobs = [{"data": {"label": str(i)}, "groupId": "D", "groupMaxSize": 2} for i in range(3)]
    reply = t.cmd(cmd="PUSHB", queue="q", jobs=jobs)
    assert reply == {"ok": False, "error": "jobs[2]: Group D has reached its maximum size of 2"}
    assert t.data("GetGroupJobsCount", groupId="D") == {"count": 0}  # nothing admitted
    # active jobs do not count against the cap
    t.pull(10)
    assert t.push("A", "4", groupMaxSize=2)["ok"]


def test_counts_and_validation() -> None:
    t = G()
    for i in range(3):
        t.push("A", f"A{i}")
    t.push("B", "B0", delay=10_000)
    assert t.data("GetGroupJobsCount", groupId="A") == {"count": 3}
    assert t.data("GetGroupJobsCount", groupId="B") == {"count": 1}
    assert t.data("GetGroupsJobsCount") == {"count": 4}
    assert t.data("GetGroupsJobsCount", maxCount=1) == {"count": 2}
    assert t.data("GetGroupJobsCount", groupId="none") == {"count": 0}
    missing = t.cmd(cmd="GetGroupJobsCount", queue="q")
    assert missing == {"ok": False, "error": "groupId is required"}
    bad = t.cmd(cmd="SetGroupConcurrency", queue="q", groupId="A", concurrency=1.5)
    assert bad == {"ok": False, "error": "concurrency must be a positive integer"}
    bad = t.cmd(cmd="SetGroupRateLimit", queue="q", groupId="A", max=1, duration=0)
    assert bad == {"ok": False, "error": "duration must be a positive integer"}
    bad = t.cmd(cmd="PauseGroup", queue="bad name", groupId="A")
    assert bad == {"ok": False, "error": "Queue name contains invalid characters"}
    assert t.data("GetGroupConcurrency", groupId="A") == {"concurrency": None}


def test_group_settings_are_persisted_and_restored() -> None:
    t = G()
    for i in range(4):
        t.push("A", f"A{i}")
    t.push("B", "B0")
    t.cmd(cmd="SetGroupConcurrency", queue="q", groupId="A", concurrency=1)
    t.cmd(cmd="SetGroupRateLimit", queue="q", groupId="A", max=10, duration=60_000)
    t.cmd(cmd="PauseGroup", queue="q", groupId="B")
    records, queues = fold_mutations(t.muts)
    back = Engine(seed=2)
    back.restore(records.values(), queues, t.now)
    reply = back.apply({"cmd": "PULLB", "queue": "q", "count": 10, "owner": "w"}, t.now).reply
    assert [j["data"]["label"] for j in reply["jobs"]] == ["A0"]
    reply = back.apply({"cmd": "IsGroupPaused", "queue": "q", "groupId": "B"}, t.now).reply
    assert reply["data"] == {"paused": True}
    reply = back.apply({"cmd": "ListQueues"}, t.now).reply
    assert reply["queues"] == ["q"]


def test_a_queue_without_groups_gets_no_group_table() -> None:
    t = G()
    t.cmd(cmd="PUSHB", queue="q", jobs=[{"data": i} for i in range(5)])
    assert len(t.pull(5)) == 5
    assert t.engine.queues["q"].groups is None
    assert t.engine.groups.blocked == set()


@pytest.mark.parametrize("ttl", [100, None])
def test_ttl_expired_grouped_jobs_are_dropped_on_pull(ttl: int | None) -> None:
    t = G()
    extra = {"ttl": ttl} if ttl else {}
    t.push("A", "old", **extra)
    t.push("A", "new")
    t.now += 200
    assert t.labels() == (["new"] if ttl else ["old", "new"])


def test_idle_groups_are_forgotten() -> None:
    t = G()
    t.push("A", "A0")
    (job,) = t.pull()
    t.cmd(cmd="ACK", id=job["id"], token=_token(t, job["id"]))
    table = t.engine.queues["q"].groups
    assert table is not None and table.groups == {}


def test_configured_groups_are_capped_per_queue() -> None:
    t = G()
    t.engine = Engine(EngineConfig(max_configured_groups=2), seed=1)
    for gid in ("a", "b"):
        assert t.data("PauseGroup", groupId=gid) == {"changed": True}
    reply = t.cmd(cmd="SetGroupConcurrency", queue="q", groupId="c", concurrency=1)
    assert reply == {"ok": False, "error": "Too many configured groups in queue q (max 2)"}
    # a configured group may still change, and one that is let go frees its place
    assert t.cmd(cmd="SetGroupConcurrency", queue="q", groupId="a", concurrency=1)["ok"]
    assert t.data("ResumeGroup", groupId="b") == {"changed": True}
    assert t.data("PauseGroup", groupId="c") == {"changed": True}


def test_a_refused_setting_leaves_no_group_behind() -> None:
    t = G()
    bad = t.cmd(cmd="SetGroupRateLimit", queue="q", groupId="x", max=0, duration=1000)
    assert bad == {"ok": False, "error": "max must be a positive integer"}
    assert "q" not in t.engine.queues


def test_group_heaps_stay_bounded_under_reprioritisation() -> None:
    t = G()
    ids = [t.push("A", f"A{i}")["id"] for i in range(3)]
    for n in range(300):
        assert t.cmd(cmd="ChangePriority", id=ids[n % 3], priority=n % 7)["ok"]
    table = t.engine.queues["q"].groups
    assert table is not None
    assert len(table.groups["A"].ready) <= 2 * 3 + 64
    assert sorted(t.labels()) == ["A0", "A1", "A2"]
    t.push("B", "B0")
    assert t.cmd(cmd="Cancel", id=t.push("B", "B1")["id"])["ok"]
    assert t.labels() == ["B0"]
    assert table.groups["B"].ready == []  # nothing waits: no dead entries kept
