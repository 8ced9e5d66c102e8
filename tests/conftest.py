"""The order of the suite's files, for CI's `pytest -n 2 --dist loadfile` (`.ci/run`).

xdist hands each worker whole files, in the order it gets them; by default it sorts them by
their number of tests, so a file of one or two long tests (the bench smoke tests) can come
last and run alone on one worker while the other idles. With `--no-loadscope-reorder`
(pyproject's addopts) it keeps this order instead: the costliest files first, by
`file_costs.txt`, then every other file in collection order, so what is left at the end is
the short files, which fill both workers. Within a file the order is unchanged.
"""

from __future__ import annotations

import pytest
from _bytecode import subprocess_bytecode  # noqa: F401  (autouse: see tests/_bytecode.py)
from _file_order import COSTS, costliest_first, file_costs


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    costliest_first(items, file_costs(COSTS.read_text()))
