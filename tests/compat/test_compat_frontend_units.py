"""The front end's bunqueue-compat pieces on their own, with time as an argument.

The worker registry's 30 s "stale" and 90 s "forgotten" rules, the Metrics counters and the
flow/cron push refusals; the process tests cannot wait out real minutes.
"""

from __future__ import annotations

from typing import Any

from shardq.runtime.frontend._compat import unsupported_push
from shardq.runtime.frontend._metrics import Counters, metrics_reply
from shardq.runtime.frontend._workers import WorkerRegistry

T0 = 1_800_000_000_000


def register(reg: WorkerRegistry, wid: str, conn: str = "c1", now: int = T0, **kw: Any) -> Any:
    cmd = {"cmd": "RegisterWorker", "name": f"n-{wid}", "queues": ["q"], "workerId": wid, **kw}
    return reg.handle("RegisterWorker", cmd, conn, now)


def listed(reg: WorkerRegistry, now: int) -> dict[str, Any]:
    data: dict[str, Any] = reg.handle("ListWorkers", {}, "c9", now)["data"]
    return data


def test_register_is_an_upsert_and_takes_float_integers() -> None:
    reg = WorkerRegistry()
    first = register(reg, "w1", concurrency=2.0, pid=12.0, startedAt=float(T0 - 5000))
    assert first["data"] == {
        "workerId": "w1",
        "status": "active",
        "name": "n-w1",
        "queues": ["q"],
        "concurrency": 2,
        "hostname": "unknown",
        "pid": 12,
        "registeredAt": T0 - 5000,
        "lastSeen": T0,
        "activeJobs": 0,
        "processedJobs": 0,
        "failedJobs": 0,
        "currentJob": None,
    }
    again = register(reg, "w1", conn="c2", now=T0 + 10, name="renamed", queues=["a", "b"])
    assert again["data"]["name"] == "n-w1" and again["data"]["queues"] == ["a", "b"]
    assert again["data"]["concurrency"] == 1 and again["data"]["registeredAt"] == T0 - 5000
    assert len(reg) == 1
    # It stays with the connection that registered it first.
    assert reg.drop_conn("c2") == 0 and reg.drop_conn("c1") == 1 and len(reg) == 0
    made_up = register(reg, "")["data"]["workerId"]
    assert isinstance(made_up, str) and len(made_up) == 36


def test_heartbeat_counters_and_stale_status() -> None:
    reg = WorkerRegistry()
    register(reg, "w1", concurrency=4)
    register(reg, "w2", concurrency=2, now=T0 + 1)
    beat = {"id": "w1", "activeJobs": 3, "processed": 10.0, "failed": 2}
    assert reg.handle("Heartbeat", beat, "c1", T0 + 20_000) == {"ok": True, "data": {"ok": True}}
    view = listed(reg, T0 + 35_000)
    assert [(w["id"], w["status"]) for w in view["workers"]] == [("w1", "active"), ("w2", "stale")]
    assert view["workers"][0]["uptime"] == 35_000
    assert view["stats"] == {
        "total": 2,
        "active": 1,
        "totalProcessed": 10,
        "totalFailed": 2,
        "activeJobs": 3,
        "concurrencySlots": 4,
    }
    # A worker that leaves still counts in the lifetime totals.
    assert reg.handle("UnregisterWorker", {"workerId": "w1"}, "c1", T0 + 36_000) == {
        "ok": True,
        "data": {"removed": True},
    }
    assert listed(reg, T0 + 36_000)["stats"]["totalProcessed"] == 10
    missing = {"ok": False, "error": "Worker not found"}
    assert reg.handle("UnregisterWorker", {"workerId": "w1"}, "c1", T0) == missing
    assert reg.handle("Heartbeat", {"id": "w1"}, "c1", T0) == missing
    assert reg.handle("Heartbeat", {"id": 5}, "c1", T0) == missing


def test_silent_workers_are_forgotten_after_three_timeouts() -> None:
    reg = WorkerRegistry()
    register(reg, "old")
    register(reg, "kept", now=T0 + 50_000)
    assert [w["id"] for w in listed(reg, T0 + 90_000)["workers"]] == ["old", "kept"]
    assert [w["id"] for w in listed(reg, T0 + 90_001)["workers"]] == ["kept"]


def test_registry_is_bounded() -> None:
    reg = WorkerRegistry(capacity=3)
    for i in range(5):
        register(reg, f"w{i}", now=T0 + i)
    assert [w["id"] for w in listed(reg, T0 + 10)["workers"]] == ["w2", "w3", "w4"]


def test_metrics_counters() -> None:
    counters = Counters()

    class Sink:
        conn = "c1"
        authenticated = True

        def __init__(self) -> None:
            self.sent: list[dict[str, Any]] = []

        def send(self, reply: dict[str, Any]) -> None:
            self.sent.append(reply)

        def drop(self, reason: str) -> None:
            raise AssertionError(reason)

    sink = Sink()
    replies: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("PUSH", {"queue": "q"}, {"ok": True, "id": "a"}),
        ("PUSHB", {"jobs": [{}, {}]}, {"ok": True, "ids": ["b", "c"]}),
        ("PUSH", {}, {"ok": False, "error": "bad"}),
        ("PULL", {}, {"ok": True, "job": None}),
        ("PULLB", {}, {"ok": True, "jobs": [{"id": "a"}, {"id": "b"}], "tokens": ["1", "2"]}),
        ("ACK", {}, {"ok": True}),
        ("ACK", {}, {"ok": True, "data": {"applied": False, "reason": "already-finalized"}}),
        ("ACKB", {"ids": ["b", "c", "d"]}, {"ok": True, "data": {"ignoredIds": ["d"]}}),
    ]
    for name, cmd, reply in replies:
        counters.watch(sink, name, cmd).send(reply)
    assert len(sink.sent) == len(replies)
    stats = [{"ok": True, "stats": {"failed": 2}}, {"ok": True, "stats": {"failed": 1}}]
    metrics = metrics_reply(counters, stats, 12.5)["metrics"]
    assert (metrics["totalPushed"], metrics["totalPulled"], metrics["totalCompleted"]) == (3, 2, 3)
    assert metrics["totalFailed"] == 3 and metrics["memoryUsageMb"] == 12.5
    assert (metrics["sqliteSizeMb"], metrics["activeConnections"]) == (0, 0)
    latency = metrics_reply(counters, stats, 12.5)["latency"]
    # Counted commands that succeeded: 2 pushes, the 1 pull that delivered, 3 ACKs.
    assert [sum(latency[k]["counts"]) for k in ("push", "pull", "ack")] == [2, 1, 3]
    down = {"ok": False, "error": "Shard unavailable"}
    assert metrics_reply(counters, [stats[0], down], 1.0) == down


def test_pushes_that_need_groups_are_refused_and_flows_pass() -> None:
    def refusal(name: str, cmd: dict[str, Any]) -> str | None:
        return unsupported_push(name, cmd)

    assert refusal("PUSH", {"data": {"name": "x"}, "dependsOn": ["a"], "childrenIds": []}) is None
    assert refusal("PUSH", {"parentId": "p"}) is None
    assert refusal("PUSH", {"childrenIds": ["c"]}) is None
    assert refusal("PUSH", {"data": {"__parentId": "pending"}}) is None
    assert refusal("PUSH", {"repeat": {"every": 5}}) is None  # the engine serves repeat
    assert refusal("PUSHB", {"jobs": [{"data": 1}, {"parentId": "p"}]}) is None
    assert refusal("PUSHB", {"jobs": [{"data": 1}, {"data": 2, "groupId": "g"}]}) == (
        "Unsupported command: PUSHB with groupId (groups)"
    )
    assert refusal("PUSH", {"data": 1, "groupId": None}) is None
    assert refusal("PUSHB", {"jobs": "not a list"}) is None  # the engine gives its own error
