"""The jobs a closed connection leaves active (a renewed lease, docs/protocol.md §2.6) and
which of them no worker shows it still has (`idle_orphans`): what a graceful stop's drain does
not wait for (docs/runtime.md, "Graceful shutdown"; the server side in
tests/runtime/test_stop_closed_lease.py)."""

from __future__ import annotations

from typing import Any

from shardq.core import Engine
from shardq.core._renew import ORPHANS_PRUNE_MIN

T0 = 1_000_000
TTL = 60_000


def _pulled(engine: Engine, conn: str, count: int) -> list[tuple[str, str]]:
    engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": {}}] * count}, T0, conn)
    reply: Any = engine.apply(
        {"cmd": "PULLB", "queue": "q", "count": count, "owner": "w", "lockTtl": TTL}, T0, conn
    ).reply
    return [(j["id"], t) for j, t in zip(reply["jobs"], reply["tokens"], strict=True)]


def _renew(engine: Engine, job_id: str, token: str, now: int, conn: str = "other") -> None:
    reply = engine.apply({"cmd": "JobHeartbeat", "id": job_id, "token": token}, now, conn).reply
    assert reply["ok"], reply


def test_idle_orphans_are_the_renewed_leases_nobody_touched_since_the_close() -> None:
    engine = Engine(seed=1)
    (a, ta), (b, tb), (c, tc), (d, _td) = _pulled(engine, "c1", 4)
    for job_id, token in ((a, ta), (b, tb), (c, tc)):
        _renew(engine, job_id, token, T0 + 1, "c1")
    engine.release("c1", T0 + 2)  # d (never renewed) goes back; a, b, c stay active
    assert engine.find(d).state == "waiting"  # type: ignore[union-attr]
    assert [engine.find(j).state for j in (a, b, c)] == ["active"] * 3  # type: ignore[union-attr]
    assert engine.consume.idle_orphans() == 3
    _renew(engine, b, tb, T0 + 3)  # its worker is alive, on another connection
    ack = engine.apply({"cmd": "ACK", "id": c, "token": tc}, T0 + 4, "other").reply
    assert ack["ok"], ack
    assert engine.consume.idle_orphans() == 1  # a only
    assert sorted(engine.store.orphans) == [a]


def test_the_table_is_pruned_as_connections_close() -> None:
    engine = Engine(seed=1)
    for i in range(ORPHANS_PRUNE_MIN + 2):
        conn = f"c{i}"
        ((job_id, token),) = _pulled(engine, conn, 1)
        _renew(engine, job_id, token, T0 + 1, conn)
        engine.release(conn, T0 + 2)
        ack = engine.apply({"cmd": "ACK", "id": job_id, "token": token}, T0 + 3).reply
        assert ack["ok"], ack
    # Every one acked: the prune past ORPHANS_PRUNE_MIN forgot them all but the last.
    assert len(engine.store.orphans) < ORPHANS_PRUNE_MIN
    assert engine.consume.idle_orphans() == 0 and engine.store.orphans == {}
