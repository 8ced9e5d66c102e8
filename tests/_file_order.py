"""Helpers of tests/conftest.py's file order (a module of its own: `conftest` is a name every
test directory's conftest.py has, so a test cannot import from it by name)."""

from __future__ import annotations

from pathlib import Path

import pytest

COSTS = Path(__file__).with_name("file_costs.txt")


def file_costs(text: str) -> dict[str, float]:
    """`SECONDS PATH` lines (`#` comments): path -> seconds."""
    costs: dict[str, float] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, path = line.split(maxsplit=1)
            costs[path.strip()] = float(seconds)
    return costs


def costliest_first(items: list[pytest.Item], costs: dict[str, float]) -> None:
    """Sort `items` in place: whole files, the costliest first, ties in collection order."""
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], index)

    def key(item: pytest.Item) -> tuple[float, int]:
        path = item.nodeid.split("::")[0]
        return (-costs.get(path, 0.0), first[path])

    items.sort(key=key)  # stable: a file's own tests keep their order
