"""Job ids (`shardq.core._ids`): a bulk push takes its ids in one call (`IdFactory.new_many`),
which must give exactly the ids, in order, that as many calls of `new` would, and leave the
factory where they would leave it, so that the one-by-one and the bulk paths of a push stay
interchangeable for a seeded engine (`tests/core/test_plain_push.py` compares them)."""

from __future__ import annotations

import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.core._ids import IdFactory

NOW = 1_700_000_000_000
UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


@settings(deadline=None)
@given(
    seed=st.integers(0, 2**32),
    calls=st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 300)), max_size=6),
)
def test_new_many_gives_what_as_many_calls_of_new_give(
    seed: int, calls: list[tuple[int, int]]
) -> None:
    """Times that step forward, repeat and step back; counts from none to hundreds."""
    bulk, single = IdFactory(random.Random(seed)), IdFactory(random.Random(seed))
    now = NOW
    for step, count in calls:
        now += step
        assert bulk.new_many(now, count) == [single.new(now) for _ in range(count)]
        assert bulk.new(now) == single.new(now)  # and both are left in the same place


def test_new_many_carries_a_full_millisecond_into_the_next() -> None:
    """More ids than the 12-bit counter holds in one millisecond: the ids move on to the next
    one, still in order and still those `new` makes."""
    bulk, single = IdFactory(random.Random(7)), IdFactory(random.Random(7))
    ids = bulk.new_many(NOW, 5000)
    assert ids == [single.new(NOW) for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == 5000
    assert all(UUID7.match(job_id) for job_id in ids)
    assert ids[0][:13] != ids[-1][:13]  # the time prefix moved on
