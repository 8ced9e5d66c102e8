"""Which queues have workers, as the front end tells the shards for cron's `skipIfNoWorker`:
the registry's per-queue counts follow every way a worker comes and goes, and the shards are
told only when a queue gains its first worker or loses its last."""

from __future__ import annotations

from typing import Any

from shardq.runtime.frontend._presence import WorkerPresence
from shardq.runtime.frontend._workers import FORGET_AFTER_MS, WorkerRegistry


def register(reg: WorkerRegistry, worker_id: str, queues: list[str], conn: str = "c1") -> None:
    cmd = {"workerId": worker_id, "queues": queues}
    assert reg.handle("RegisterWorker", cmd, conn, 0)["ok"]


def changed(reg: WorkerRegistry) -> bool:
    was, reg.served_changed = reg.served_changed, False
    return was


def test_the_served_queues_follow_workers_coming_and_going() -> None:
    reg = WorkerRegistry()
    register(reg, "a", ["q1", "q2", "q1"])
    assert reg.queues() == {"q1", "q2"} and changed(reg)
    register(reg, "b", ["q1"], conn="c2")
    assert not changed(reg)  # q1 had a worker already
    register(reg, "a", ["q3"])  # re-registered with other queues
    assert reg.queues() == {"q1", "q3"} and changed(reg)
    assert reg.handle("Heartbeat", {"id": "a"}, "c1", 10)["ok"] and not changed(reg)
    assert reg.handle("UnregisterWorker", {"workerId": "b"}, "c2", 10)["ok"]
    assert reg.queues() == {"q3"} and changed(reg)  # "b" was q1's last worker
    reg.drop_conn("c1")
    assert reg.queues() == frozenset() and changed(reg)


def test_a_silent_worker_forgotten_stops_serving() -> None:
    reg = WorkerRegistry()
    register(reg, "a", ["q"])
    changed(reg)
    reg.handle("ListWorkers", {}, "c9", FORGET_AFTER_MS + 1)
    assert reg.queues() == frozenset() and changed(reg)


def test_capacity_eviction_stops_serving() -> None:
    reg = WorkerRegistry(capacity=1)
    register(reg, "a", ["old"])
    register(reg, "b", ["new"])
    assert reg.queues() == {"new"}


def test_shards_are_told_only_when_the_set_changes() -> None:
    sent: list[tuple[int, dict[str, Any]]] = []
    presence = WorkerPresence(2, lambda shard, msg: sent.append((shard, msg)))
    presence.update(frozenset({"b", "a"}))
    presence.update(frozenset({"a", "b"}))
    presence.shard_up(1)
    msg = {"t": "workers", "queues": ["a", "b"]}
    assert sent == [(0, msg), (1, msg), (1, msg)]
