"""The front end's job-to-shard cache is bounded in entries and in bytes, and can be emptied
(the front end does it when it gives memory back after a busy period)."""

from __future__ import annotations

from collections import OrderedDict

from shardq.runtime.frontend._merge import CACHE_ENTRY_BYTES, JobCache


def test_the_entry_bound_drops_the_oldest() -> None:
    cache = JobCache(capacity=3, max_bytes=1 << 20)
    cache.learn(["a", "b", "c", "d"], 1)
    assert len(cache) == 3
    assert cache.get("a") is None
    assert cache.get("d") == 1


def test_the_byte_bound_counts_each_id_and_its_overhead() -> None:
    ids = [f"{i:036d}" for i in range(100)]
    per_id = 36 + CACHE_ENTRY_BYTES
    cache = JobCache(capacity=1000, max_bytes=10 * per_id)
    cache.learn(ids, 0)
    assert len(cache) == 10
    assert cache.bytes == 10 * per_id
    assert cache.get(ids[-1]) == 0 and cache.get(ids[89]) is None
    # Long custom ids hold fewer entries under the same bound.
    cache.learn(["x" * (per_id * 3)], 1)
    assert len(cache) <= 7
    assert cache.bytes <= cache.max_bytes


def test_learning_an_id_again_counts_it_once() -> None:
    cache = JobCache(capacity=10, max_bytes=1 << 20)
    cache.learn(["a", "b"], 0)
    cache.learn(["a"], 1)
    assert cache.bytes == 2 * (1 + CACHE_ENTRY_BYTES)
    assert cache.get("a") == 1


class _CountingDict(OrderedDict[str, int]):
    moves = 0

    def move_to_end(self, key: str, last: bool = True) -> None:
        type(self).moves += 1
        super().move_to_end(key, last)


def test_learning_keeps_the_newest_last_and_moves_only_known_ids() -> None:
    cache = JobCache(capacity=3, max_bytes=1 << 20)
    counted = _CountingDict()
    cache._shards = counted
    cache.learn(["a", "b", "c"], 0)
    assert _CountingDict.moves == 0  # new ids go in at the end by themselves
    cache.learn(["a"], 1)  # learned again: now the newest
    assert _CountingDict.moves == 1
    cache.learn(["d"], 2)  # drops the oldest, which is "b" now, not "a"
    assert list(counted) == ["c", "a", "d"]
    assert cache.get("b") is None and cache.get("a") == 1


def test_clear_empties_it_and_its_count() -> None:
    cache = JobCache(capacity=10, max_bytes=1 << 20)
    cache.learn(["a", "b"], 0)
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0
    cache.learn(["c"], 1)
    assert cache.get("c") == 1 and cache.bytes == 1 + CACHE_ENTRY_BYTES


def test_holder_names_the_one_shard_of_every_id_or_none() -> None:
    cache = JobCache(capacity=10, max_bytes=1 << 20)
    cache.learn(["a", "b"], 1)
    cache.learn(["c"], 0)
    assert cache.holder(["a", "b", "a"]) == 1
    assert cache.holder(["c"]) == 0
    assert cache.holder(["a", "c"]) is None  # two shards: the batch is split
    assert cache.holder(["a", "x"]) is None  # one unknown: looked up everywhere
    assert cache.holder([]) is None
    assert cache.holder(["a", 1]) is None  # not a string
    assert cache.holder(["a", ["b"]]) is None  # not even hashable
