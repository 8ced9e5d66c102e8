"""`IdOrder` behaves like the `OrderedDict` of ids to None it replaces."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardq.core._order import IdOrder

IDS = st.sampled_from([f"j{i}" for i in range(12)])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(IDS, max_size=4)),
        st.tuples(st.just("discard"), IDS),
        st.tuples(st.just("pop"), st.none()),
    ),
    max_size=200,
)


@given(OPS)
def test_idorder_matches_an_ordered_dict(ops: list[tuple[str, object]]) -> None:
    order, model = IdOrder(), OrderedDict[str, None]()
    for op, arg in ops:
        if op == "add":
            assert isinstance(arg, list)
            order.add_all(arg)
            for item in arg:
                model[item] = None
        elif op == "discard":
            assert isinstance(arg, str)
            order.discard(arg)
            model.pop(arg, None)
        elif model:
            assert order.pop_oldest() == model.popitem(last=False)[0]
        else:
            with pytest.raises(KeyError):
                order.pop_oldest()
        assert list(order) == list(model)
        assert len(order) == len(model)
        assert all(item in order for item in model)


def test_discards_do_not_grow_the_order_without_bound() -> None:
    order = IdOrder()
    for i in range(10_000):
        order.add_all([f"j{i}"])
        order.discard(f"j{i}")
    assert len(order) == 0
    assert len(order._ids) <= 64 + 1
