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


def _reference(seed: int, times: list[int]) -> list[str]:
    """The ids of RFC 9562 method 1 as `IdFactory` defines them, formatted the plain way:
    48 bits of milliseconds, version 7, a 12-bit counter seeded with 11 random bits each new
    millisecond, variant 10 and 62 random bits."""
    rng = random.Random(seed)
    rng.getrandbits(64)  # the factory's lease-token prefix, drawn first
    last, counter, out = -1, 0, []
    for now in times:
        if now > last:
            last, counter = now, rng.getrandbits(11)
        else:
            counter += 1
            if counter > 0xFFF:
                last, counter = last + 1, rng.getrandbits(11)
        rand = rng.getrandbits(62)
        ms, hi, lo = f"{last:012x}", 0x8000 | rand >> 48, rand & (1 << 48) - 1
        out.append(f"{ms[:8]}-{ms[8:]}-7{counter:03x}-{hi:04x}-{lo:012x}")
    return out


def test_the_ids_are_uuid7_fields_in_hex() -> None:
    """Every field lands in its place (the counter's digits and the random bits are looked up
    and converted, not formatted, in `IdFactory`)."""
    times = [NOW] * 5000 + [NOW + 1] * 3 + [NOW - 2] * 2 + [NOW + 9]
    ids = IdFactory(random.Random(11))
    assert [ids.new(now) for now in times] == _reference(11, times)
    bulk = IdFactory(random.Random(11))
    assert bulk.new_many(NOW, 5000) == _reference(11, times)[:5000]
