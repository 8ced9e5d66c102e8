"""Partition leases and fencing on the real PostgreSQL test server (`pg_server`): the lease
statements of `shardq.cluster._leases` between two nodes, and the store's fence refusing, in
the batch's own transaction, the writes of a node whose lease passed to another.

Deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pg_server import shared_server

from shardq.cluster._leases import (
    ClusterMismatch,
    acquire,
    cluster_map,
    ensure_partitions,
    heartbeat,
    live_nodes,
    release,
    renew,
)
from shardq.protocol._partitions import partition_of
from shardq.storage import StorageFenced, open_postgres
from shardq.storage._pg_fence import Fence
from shardq.storage._pg_schema import Conn
from shardq.storage._postgres import PostgresStore

NEEDS_POSTGRES = True
PARTS = 8
LEASE_MS = 400


@pytest.fixture
def store() -> Iterator[PostgresStore]:
    with open_postgres(shared_server().url(), schema=f"l_{uuid.uuid4().hex[:12]}") as s:
        yield s


@pytest.fixture
def conns(store: PostgresStore) -> Iterator[tuple[Conn, Conn]]:
    a, b = store.new_connection(), store.new_connection()
    ensure_partitions(a, PARTS)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _job(job_id: str, queue: str) -> dict[str, Any]:
    return {"id": job_id, "queue": queue, "state": "waiting", "seq": 1, "data": {}}


def _queue_in(part: int) -> str:
    return next(f"q{i}" for i in range(10_000) if partition_of(f"q{i}", PARTS) == part)


def test_the_partition_count_is_fixed_at_the_first_start(conns: tuple[Conn, Conn]) -> None:
    a, _ = conns
    ensure_partitions(a, PARTS)  # the same count again: fine
    with pytest.raises(ClusterMismatch, match=f"partitions = 16.*set up with {PARTS}"):
        ensure_partitions(a, 16)
    assert a.execute("SELECT count(*) FROM partition_leases").fetchone() == (PARTS,)


def test_two_nodes_split_and_a_lapsed_lease_passes_with_a_new_epoch(
    conns: tuple[Conn, Conn],
) -> None:
    a, b = conns
    assert heartbeat(a, "A", "h:1", "sa", LEASE_MS) and heartbeat(b, "B", "h:2", "sb", LEASE_MS)
    assert live_nodes(a, LEASE_MS) == 2
    held_a = acquire(a, "A", {}, 4, LEASE_MS)
    held_b = acquire(b, "B", {}, 8, LEASE_MS)  # only the four free ones
    assert sorted(held_a) == [0, 1, 2, 3] and sorted(held_b) == [4, 5, 6, 7]
    assert set(held_a.values()) == {1}
    nodes, owners = cluster_map(a, LEASE_MS, 10 * LEASE_MS)
    assert [(n.id, n.address, n.alive, n.partitions) for n in nodes] == [
        ("A", "h:1", True, 4),
        ("B", "h:2", True, 4),
    ]
    assert owners == {p: "A" if p < 4 else "B" for p in range(PARTS)}
    # A goes quiet past its lease: B takes its partitions, each with the next epoch.
    time.sleep(LEASE_MS / 1000 + 0.1)
    assert renew(b, "B", held_b, LEASE_MS) == held_b
    taken = acquire(b, "B", held_b, 8, LEASE_MS)
    assert taken == {0: 2, 1: 2, 2: 2, 3: 2}
    assert renew(a, "A", held_a, LEASE_MS) == {}  # A's epochs are gone: nothing renewed
    # Another process under B's id is refused while B is alive.
    assert heartbeat(b, "B", "h:2", "sb", LEASE_MS)
    assert not heartbeat(a, "B", "h:9", "other", LEASE_MS)
    release(b, "B", taken)
    assert sorted(acquire(a, "A", {}, 8, LEASE_MS)) == [0, 1, 2, 3]


def test_the_database_refuses_a_stale_owners_batch(
    store: PostgresStore, conns: tuple[Conn, Conn]
) -> None:
    a, b = conns
    queue = _queue_in(0)
    held: dict[int, int] = acquire(a, "A", {}, PARTS, LEASE_MS)
    store.fence = Fence("A", PARTS, lambda: held)
    store.apply([("put", _job("before", queue))])
    # B takes partition 0 (A's lease lapsed); A still believes it holds it.
    time.sleep(LEASE_MS / 1000 + 0.1)
    assert acquire(b, "B", {}, 1, LEASE_MS) == {0: 2}
    with pytest.raises(StorageFenced, match="no longer holds partition") as refused:
        store.apply([("put", _job("after", queue)), ("upd", "before", {"state": "active"})])
    assert refused.value.lost == (0,)
    rows = store.new_connection().execute("SELECT id, state FROM jobs").fetchall()
    assert rows == [("before", "waiting")]
    # Partitions the node does not believe it holds are refused before the database.
    held = {p: e for p, e in held.items() if p != 0}
    with pytest.raises(StorageFenced, match="does not hold partition"):
        store.apply([("del", "before")])
    # Its other partitions still write.
    other = _queue_in(1)
    assert store.apply([("put", _job("elsewhere", other))]) == 1
