"""The building blocks of the port bounds, without a server: the per-address Auth throttle,
the descriptor-bounded caps, strict JSON and query numbers (issue 26 section 3)."""

from __future__ import annotations

import resource

import pytest

from shardq.runtime._ports import AuthThrottle, connection_cap
from shardq.runtime.http._body import BadInput, parse_json, query_int
from shardq.runtime.http._conns import http_caps


def test_throttle_lets_free_failures_through_then_spaces_attempts() -> None:
    throttle = AuthThrottle(free=3, window_s=60, delay_s=0.1, max_delay_s=1.0)
    for i in range(3):
        assert throttle.reserve("a", 0.0) == 0.0
        assert throttle.failed("a", 0.0) == i + 1
    # Concurrent attempts queue: each later one waits for the one before (0.1, 0.2, 0.4 ...).
    waits = [throttle.reserve("a", 0.0) for _ in range(4)]
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8])
    # The next turn would be more than the longest delay away: refused unchecked.
    assert throttle.reserve("a", 0.0) == -1.0
    # Another address is untouched.
    assert throttle.reserve("b", 0.0) == 0.0


def test_throttle_forgives_after_a_quiet_window() -> None:
    throttle = AuthThrottle(free=1, window_s=10, delay_s=0.5, max_delay_s=5.0)
    throttle.failed("a", 0.0)
    throttle.failed("a", 0.0)
    assert throttle.reserve("a", 0.0) > 0
    assert throttle.failures("a", 11.0) == 0
    assert throttle.reserve("a", 11.0) == 0.0


def test_throttle_table_is_bounded() -> None:
    throttle = AuthThrottle(free=1, window_s=60, delay_s=0.1, max_delay_s=1.0, size=100)
    for i in range(1_000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(throttle) == 100


def test_caps_stay_below_the_descriptor_limit() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap(10**9, 64) == soft - 64
    connections, streams = http_caps(10**9, 10**9, 64)
    assert connections + 2 * streams <= soft - 64
    assert http_caps(10, 5, 64) == (10, 5)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("[" * 100_000 + "]" * 100_000, "Invalid JSON body: nested too deeply"),
        ('{"n": 18446744073709551616}', "Invalid JSON body: integer out of range"),
        ('{"n": -9223372036854775809}', "Invalid JSON body: integer out of range"),
        ('{"n": ' + "9" * 5000 + "}", "Invalid JSON body: integer out of range"),
        ('{"n": NaN}', "Invalid JSON body: NaN is not a number JSON allows"),
        ('{"n": -Infinity}', "Invalid JSON body: -Infinity is not a number JSON allows"),
        ('{"n": 1e999}', "Invalid JSON body: number out of range"),
        ('{"n": ', "Invalid JSON body"),
        (b'{"s": "\xff"}', "Invalid JSON body: not UTF-8"),
    ],
)
def test_strict_json_refusals(raw: str | bytes, error: str) -> None:
    with pytest.raises(BadInput, match="^" + error.replace("(", r"\(") + "$") as caught:
        parse_json(raw)
    assert caught.value.status == 400


def test_strict_json_accepts_the_64_bit_range() -> None:
    assert parse_json('{"a": 18446744073709551615, "b": -9223372036854775808, "c": 1.5}') == {
        "a": 2**64 - 1,
        "b": -(2**63),
        "c": 1.5,
    }


def test_query_int() -> None:
    assert query_int(None, 7) == 7
    assert query_int("abc", 7) == 7  # bunqueue's leniency for a non-number
    assert query_int("12") == 12
    with pytest.raises(BadInput):
        query_int("9" * 30)
