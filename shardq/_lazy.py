"""Package exports imported on first use.

A package `__init__` that re-exports names from its submodules makes every process that
imports the package load them all. `shardq.core`, `shardq.storage` and `shardq.backup` instead
map each exported name to its submodule and load it when the name is first read (PEP 562's
module `__getattr__`): a process that only needs one small class does not pay for the engine,
the store or the snapshot code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: `homes` maps an exported name to the submodule
    that defines it; a name once read is put in `namespace` (the package's globals), so it is
    found directly from then on."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    return __getattr__
