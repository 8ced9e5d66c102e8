"""`partition_of`: queue name -> partition, the same in every process, run and machine."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections import Counter

import pytest

from shardq.cluster import partition_of
from shardq.cluster._map import PartitionGuard, moved_error

NAMES = ["emails", "", "q0", "ünïcödé", "a" * 1000, "orders\udcff", "x\x1fy"]


def test_the_partition_is_crc32_of_the_utf8_name_modulo_the_count() -> None:
    for name in NAMES:
        data = name.encode("utf-8", "surrogatepass")
        for count in (1, 7, 256, 65_536):
            assert partition_of(name, count) == zlib.crc32(data) % count
            assert 0 <= partition_of(name, count) < count
    # Pinned values: a change of the function would move every queue of a running cluster.
    assert [partition_of(n, 256) for n in ("emails", "q0", "orders")] == [82, 228, 238]
    assert [partition_of(n, 65_536) for n in ("emails", "q0", "orders")] == [59474, 27364, 65006]


@pytest.mark.parametrize("seed", ["0", "1", "12345"])
def test_the_same_in_another_process_whatever_its_hash_seed(seed: str) -> None:
    code = (
        "from shardq.cluster import partition_of; import sys, json;"
        f"print(json.dumps([partition_of(n, 256) for n in {NAMES!r}]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.strip() == str([partition_of(n, 256) for n in NAMES]).replace("'", '"')


def test_queues_spread_over_the_partitions() -> None:
    counts = Counter(partition_of(f"queue-{i}", 256) for i in range(25_600))
    assert len(counts) == 256
    assert max(counts.values()) < 3 * 100  # about 100 each


def test_the_guard_serves_held_partitions_and_names_the_owner_of_others(tmp_path: object) -> None:
    import time

    guard = PartitionGuard(str(tmp_path), "a", 8)
    mine = next(f"q{i}" for i in range(100) if partition_of(f"q{i}", 8) == 3)
    theirs = next(f"q{i}" for i in range(100) if partition_of(f"q{i}", 8) == 5)
    nobody = next(f"q{i}" for i in range(100) if partition_of(f"q{i}", 8) == 6)
    nodes = [{"id": "a", "address": "h:1"}, {"id": "b", "address": "h:2"}]
    doc = {"held": [3], "epochs": [1], "valid_until": time.monotonic() + 60, "nodes": nodes,
           "owners": {"3": "a", "5": "b"}}  # fmt: skip
    guard.load(doc)
    assert guard.refusal(mine) is None
    assert guard.refusal(theirs) == moved_error(5, "h:2") == "MOVED 5 h:2"
    assert (guard.refusal(nobody) or "").startswith("Partition unavailable")
    # A lease not renewed in time: nothing is served, even what the map says is held.
    guard.load({**doc, "valid_until": time.monotonic() - 1})
    assert (guard.refusal(mine) or "").startswith("Partition unavailable")
