"""What every server process leaves out of its imports.

Each process is its own Python interpreter (`python -m shardq.runtime.<role>`), so every
module one imports is paid for once per process: six times on a two-shard server. Some
libraries we use import large optional extras when they find them installed, though no
server code path uses them:

- structlog imports `rich` (and through it `pygments`), `colorama` and `greenlet` for its
  development renderer and its pretty tracebacks; our logging renders plain tracebacks in
  both formats (`shardq._logging`), so none of them is ever called;
- sqlite-utils imports `numpy` and `pandas` to map their column types (we create tables
  from Python types only, and only when migrating).

Measured on one process (python 3.11, x86_64): a bare interpreter 13.6 MB; structlog
30.9 MB with the extras, 23.8 MB without; sqlite-utils 36.5 MB with numpy, 24.1 MB without.

`skip_extras` makes those modules unimportable: a finder first on `sys.meta_path` raises
`ModuleNotFoundError` for them (the case each library handles). It does not put `None` in
`sys.modules`, the other documented way, because some libraries test `"numpy" in
sys.modules` and then use it: psycopg's adapters did, and every PostgreSQL write failed.
Each role's `__main__` calls it before it imports the role's code, so only the server's
processes do this: a program that imports shardq as a library keeps its own modules. (For
that, the role packages' `__init__` import nothing: `python -m` imports the package before
its `__main__`.)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["SKIPPED_EXTRAS", "skip_extras"]

SKIPPED_EXTRAS: Sequence[str] = (
    "numpy",
    "pandas",
    "rich",
    "pygments",
    "colorama",
    "better_exceptions",
    "greenlet",
)


class _Absent:
    """A meta path finder that refuses the skipped extras and their submodules."""

    @staticmethod
    def find_spec(
        name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.partition(".")[0] in SKIPPED_EXTRAS:
            raise ModuleNotFoundError(f"No module named {name!r} (left out of shardq's servers)")
        return None


def skip_extras() -> None:
    """Make the optional extras above unimportable in this process (those not yet imported)."""
    if not any(isinstance(f, _Absent) for f in sys.meta_path):
        sys.meta_path.insert(0, _Absent())
