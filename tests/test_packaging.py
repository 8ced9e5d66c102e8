"""The package list in pyproject.toml names every package of the source tree.

An editable install maps whole directories, so a subpackage missing from the list still imports
in development and in CI; only a built wheel would lack it. This test reads the list instead.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _listed() -> set[str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return set(tomllib.load(f)["tool"]["setuptools"]["packages"])


def _on_disk() -> set[str]:
    found = {"shardq_cli"}  # `cli/`, installed under that name (package-dir)
    for top in ("shardq", "soak"):
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT).parts))
    return found


def test_every_package_is_listed_for_the_wheel() -> None:
    assert _on_disk() - _listed() == set()


def test_every_listed_package_exists() -> None:
    assert _listed() - _on_disk() == set()
