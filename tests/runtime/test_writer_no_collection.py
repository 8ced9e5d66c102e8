"""The writer keeps the cyclic collector off while it reads and flushes a batch, and leaves
it as it found it afterwards (`writer/_process._no_collection`, one instance every turn)."""

from __future__ import annotations

import gc

import pytest

from shardq.runtime.writer._process import _no_collection


def test_the_collector_is_off_inside_and_back_on_after_every_turn() -> None:
    assert gc.isenabled()
    for _turn in range(3):  # the same instance, turn after turn
        with _no_collection:
            assert not gc.isenabled()
        assert gc.isenabled()


def test_it_is_back_on_after_an_error_and_stays_off_if_it_was_off() -> None:
    with pytest.raises(RuntimeError), _no_collection:
        raise RuntimeError("a failing flush")
    assert gc.isenabled()
    gc.disable()
    try:
        with _no_collection:
            assert not gc.isenabled()
        assert not gc.isenabled()  # whoever turned it off turns it on
    finally:
        gc.enable()
