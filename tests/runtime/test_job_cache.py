"""The front end's job-to-shard cache is bounded in entries and in bytes, and can be emptied
(the front end does it when it gives memory back after a busy period)."""

from __future__ import annotations

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


def test_an_id_learned_again_outlives_the_ids_learned_before_that() -> None:
    cache = JobCache(capacity=4, max_bytes=1 << 20)
    cache.learn(["a"], 0)
    cache.learn(["b"], 0)
    cache.learn(["a"], 1)  # learned again (a pull after its push): young again
    cache.learn(["c"], 0)
    assert cache.get("b") is None  # learned before "a" was learned again: dropped first
    assert cache.get("a") == 1 and cache.get("c") == 0
    assert len(cache) <= 4


def test_the_newest_half_is_always_kept_within_both_bounds() -> None:
    per_id = 10 + CACHE_ENTRY_BYTES
    for capacity, max_bytes in ((1_000, 1 << 20), (100_000, 700 * per_id)):
        cache = JobCache(capacity=capacity, max_bytes=max_bytes)
        kept = min(capacity, max_bytes // per_id) // 2
        learned: list[str] = []
        for batch in range(100):  # bounded: 7,000 ids, 70 a reply (generations overshoot)
            ids = [f"{batch * 70 + k:010d}" for k in range(70)]
            cache.learn(ids, batch % 2)
            learned += ids
            assert len(cache) <= capacity and cache.bytes <= max_bytes
            newest = learned[-(kept - 70) :]
            assert [cache.get(i) for i in newest] == [int(i) // 70 % 2 for i in newest]
        assert cache.get(learned[0]) is None  # the oldest went


def test_holder_reads_the_old_generation_too() -> None:
    cache = JobCache(capacity=4, max_bytes=1 << 20)
    cache.learn(["a", "b"], 1)  # half the bound: now the old generation
    cache.learn(["c"], 0)
    assert cache.holder(["a", "b"]) == 1
    assert cache.holder(["a", "c"]) is None  # two shards
    cache.learn(["a"], 0)  # learned again, elsewhere: the young entry wins
    assert cache.holder(["a", "c"]) == 0


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
