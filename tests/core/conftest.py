"""Fixtures for the engine tests: a seeded engine and a driver around it."""

from __future__ import annotations

import pytest
from engine_driver import Driver

from shardq.core import Engine


@pytest.fixture
def engine() -> Engine:
    return Engine(seed=1)


@pytest.fixture
def d(engine: Engine) -> Driver:
    return Driver(engine)
