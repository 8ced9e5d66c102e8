"""tests/conftest.py's order of the suite's files: the costliest first, whole files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _file_order import COSTS, costliest_first, file_costs

REPO = Path(__file__).resolve().parents[1]


def _items(*nodeids: str) -> list[Any]:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_the_costliest_file_goes_first_and_each_file_stays_whole_and_in_order() -> None:
    items = _items("a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "b.py::t2", "d.py::t1")
    costliest_first(items, {"b.py": 50.0, "c.py": 80.0})
    assert [i.nodeid for i in items] == [
        "c.py::t1", "b.py::t1", "b.py::t2", "a.py::t1", "a.py::t2", "d.py::t1"
    ]  # fmt: skip


def test_every_file_in_the_costs_exists() -> None:
    """A file renamed or removed would silently fall back to the end: refresh the list."""
    costs = file_costs(COSTS.read_text())
    assert len(costs) > 50
    missing = [path for path in costs if not (REPO / path).is_file()]
    assert missing == []


def test_pyproject_keeps_xdist_from_sorting_files_by_their_number_of_tests() -> None:
    assert "--no-loadscope-reorder" in (REPO / "pyproject.toml").read_text()
