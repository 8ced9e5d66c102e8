"""The front end's guard serves a partition only when its lease is held AND every shard has
loaded it under that lease's epoch; a shard's `Holdings` say what to load and drop when the
leases change."""

from __future__ import annotations

import json
import time
from pathlib import Path

from shardq.cluster import partition_of
from shardq.cluster._map import PartitionGuard, held_pairs, read_holding, write_holding
from shardq.runtime._routing import shard_of
from shardq.runtime.shard._takeover import Holdings, initial_partitions

PARTS = 8


def _queue(part: int) -> str:
    return next(f"q{i}" for i in range(1000) if partition_of(f"q{i}", PARTS) == part)


def _map(held: dict[int, int]) -> dict[str, object]:
    nodes = [{"id": "a", "address": "h:1"}, {"id": "b", "address": "h:2"}]
    owners = {str(p): "a" for p in held} | {"5": "b"}
    return {"held": sorted(held), "epochs": [held[p] for p in sorted(held)],
            "valid_until": time.monotonic() + 60, "nodes": nodes, "owners": owners}  # fmt: skip


def test_a_leased_partition_is_served_once_every_shard_has_loaded_it(tmp_path: Path) -> None:
    guard = PartitionGuard(str(tmp_path), "a", PARTS, shards=2)
    guard.load(_map({1: 4, 3: 1}))
    one, three = _queue(1), _queue(3)
    assert guard.behind() == [0, 1]
    assert "is loading partition 1" in (guard.refusal(one) or "")
    guard.loaded(0, [(1, 4), (3, 1)])
    assert "is loading partition 1" in (guard.refusal(one) or "")  # shard 1 has not said yet
    guard.loaded(1, [(1, 4)])
    assert guard.behind() == [1]
    assert guard.refusal(one) is None
    assert "is loading partition 3" in (guard.refusal(three) or "")
    guard.loaded(1, [(1, 4), (3, 1)])
    assert guard.behind() == [] and guard.refusal(three) is None
    # A shard that goes away holds nothing known until it reports again.
    guard.forget(0)
    assert guard.behind() == [0]
    assert guard.refusal(one) is not None
    guard.loaded(0, [(1, 4), (3, 1)])
    # The same partition under a new lease (lost, then taken again): what the shards hold
    # is from the old one, so it is not served until they have loaded it again.
    guard.load(_map({1: 6, 3: 1}))
    assert "is loading partition 1" in (guard.refusal(one) or "")
    assert guard.refusal(three) is None
    # A lost lease is refused at once, whatever the shards still hold: MOVED to its new
    # owner, or unavailable while it has none.
    guard.load(_map({1: 6}))
    assert (guard.refusal(three) or "").startswith(
        "Partition unavailable: node a does not hold partition 3"
    )
    assert guard.refusal(_queue(5)) == "MOVED 5 h:2"
    assert guard.behind() == [0, 1]


def test_the_holding_file_is_the_union_of_what_the_shards_hold(tmp_path: Path) -> None:
    guard = PartitionGuard(str(tmp_path), "a", PARTS, shards=2)
    assert read_holding(str(tmp_path)) is None
    guard.loaded(0, [(1, 4), (3, 1)])
    guard.loaded(1, [(1, 4)])
    write_holding(str(tmp_path), guard.holding())
    assert read_holding(str(tmp_path)) == {1, 3}
    guard.loaded(0, [(1, 4)])  # shard 0 dropped 3, its mutations committed
    write_holding(str(tmp_path), guard.holding())
    assert read_holding(str(tmp_path)) == {1}
    (tmp_path / "holding.json").write_text("[1]")
    assert read_holding(str(tmp_path)) is None


def test_held_pairs_leave_malformed_maps_out() -> None:
    assert held_pairs({"held": [1, 2], "epochs": [5, 6]}) == {(1, 5), (2, 6)}
    assert held_pairs({"held": [1, 2], "epochs": [5]}) == frozenset()
    assert held_pairs({"held": [1, "x"], "epochs": [5, 6]}) == {(1, 5)}
    assert held_pairs({"held": 3}) == frozenset()


def test_holdings_follow_the_leases(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps({"held": [2, 4], "epochs": [1, 1]}))
    held = initial_partitions(str(tmp_path))
    assert held == {2: 1, 4: 1}
    assert initial_partitions(str(tmp_path / "none")) == {}
    holdings = Holdings(1, 2, PARTS, held)
    gained, lost = holdings.change([(4, 1), (6, 3)])
    assert (gained, lost, holdings.held) == ({6}, {2}, {4: 1, 6: 3})
    # Held again under a new epoch: dropped and loaded again.
    assert holdings.change([(4, 2), (6, 3)]) == ({4}, {4})
    assert holdings.pairs() == ([4, 6], [2, 3])
    names = [f"q{i}" for i in range(200)]
    mine = holdings.owns({6})
    assert [n for n in names if mine(n)] == [
        n for n in names if shard_of(n, 2) == 1 and partition_of(n, PARTS) == 6
    ]
    assert holdings.queues_of(names, {2}) == {n for n in names if partition_of(n, PARTS) == 2}
