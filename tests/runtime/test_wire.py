"""`_wire.exact_packer`: the same bytes as `pack` for any value, faster for maps and lists."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardq.core import Engine
from shardq.runtime.links._control import exact_packer, pack


class _Int(int):
    pass


class _Str(str):
    pass


class _List(list):  # type: ignore[type-arg]
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.builds(_Int, st.integers(min_value=-(2**31), max_value=2**31)),
    st.builds(_Str, st.text(max_size=5)),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=5)),
)
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=5).map(tuple),
        st.lists(inner, max_size=5).map(_List),
        st.dictionaries(st.text(max_size=5), inner, max_size=5),
        st.dictionaries(st.text(max_size=5), inner, max_size=5).map(_Dict),
        st.dictionaries(st.text(max_size=5), inner, max_size=5).map(OrderedDict),
    ),
    max_leaves=30,
)


@given(_values)
def test_the_exact_packer_gives_the_bytes_msgpack_gives(value: Any) -> None:
    assert exact_packer()(value) == pack(value)


@pytest.mark.parametrize("value", [object(), {1, 2}, [1, {"a": object()}], (b"x", {3})])
def test_the_exact_packer_refuses_what_msgpack_refuses(value: Any) -> None:
    with pytest.raises(TypeError):
        pack(value)
    with pytest.raises(TypeError):
        exact_packer()(value)


def test_the_exact_packer_encodes_engine_output_as_msgpack_does() -> None:
    engine = Engine(seed=3)
    now = 1_700_000_000_000
    _reply, puts = (
        (
            outcome := engine.apply(
                {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": {"i": 1}}]}, now
            )
        ).reply,
        outcome.mutations,
    )
    reply, upds = (
        (
            outcome := engine.apply({"cmd": "PULLB", "queue": "q", "count": 5, "owner": "w"}, now)
        ).reply,
        outcome.mutations,
    )
    pack = exact_packer()
    for value in (reply, puts, upds, {"t": "rep", "items": [["t1", 1, reply]]}):
        assert pack(value) == pack(value)
