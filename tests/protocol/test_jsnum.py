"""`encode_js`: the TCP port's frames, with integers beyond 32 bits as float64 (bunqueue's JS
clients read a msgpack int64 as BigInt). Same values otherwise, bytes as `encode` elsewhere."""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from shardq.protocol import FRAME_HEADER, encode, encode_js

NOW_MS = 1_800_000_000_000


def body(frame: bytes) -> Any:
    (size,) = FRAME_HEADER.unpack(frame[: FRAME_HEADER.size])
    assert size == len(frame) - FRAME_HEADER.size
    return msgpack.unpackb(frame[FRAME_HEADER.size :])


def test_large_ints_become_floats_small_ones_and_bools_stay() -> None:
    reply = {
        "ok": True,
        "job": {"createdAt": NOW_MS, "attempts": 2, "timeline": [{"timestamp": NOW_MS}]},
        "jobs": [{"runAt": NOW_MS, "data": {"n": 2**40}, "lifo": False}],
        "edges": [2**31 - 1, -(2**31), 2**32 - 1, 2**32, -(2**31) - 1],
        "nested": ({"t": NOW_MS},),
    }
    got = body(encode_js(reply))
    assert got["ok"] is True
    assert got["job"] == {
        "createdAt": float(NOW_MS),
        "attempts": 2,
        "timeline": [{"timestamp": float(NOW_MS)}],
    }
    assert type(got["job"]["attempts"]) is int
    assert got["jobs"][0]["runAt"] == float(NOW_MS) and got["jobs"][0]["lifo"] is False
    assert type(got["jobs"][0]["data"]["n"]) is float  # caught by the marker check
    assert [type(v) for v in got["edges"]] == [int, int, int, float, float]
    assert got["nested"] == [{"t": float(NOW_MS)}]


def test_replies_without_large_ints_are_encoded_as_before() -> None:
    for reply in ({"ok": True, "id": "a\xcf\xd3b"}, {"ok": True, "count": 7}, {"ok": False}):
        assert encode_js(dict(reply)) == encode(reply)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_values_are_kept_exactly(value: Any) -> None:
    got = body(encode_js({"v": value}))["v"]
    expected = body(encode({"v": value}))["v"]
    assert got == expected  # a float equal to the int: exact below 2**53, as shardq's are
