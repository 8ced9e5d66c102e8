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

`defer_asyncio` is for the roles that run no event loop (the supervisor, the writer, the
shards): structlog imports `asyncio` (for its loggers' `a...` methods, which we never call),
and `asyncio` imports `ssl` and its C extensions: 5.3 MB of the writer's and each shard's
idle size, 2.7 MB of the supervisor's (python 3.11, measured as above). It puts a stand-in
module under the name: a package with asyncio's `__path__` (a submodule still imports as
itself, and reading one as an attribute imports it), whose first read of any other
attribute imports the real asyncio, puts it in
`sys.modules` and answers from it from then on, and logs `asyncio imported on first use`
with the attribute read (psycopg reads one as it is imported: a writer or shard on
PostgreSQL loads asyncio at its start, as before). Nothing is refused; only the memory of a
module no one uses is saved.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from importlib.abc import Loader
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType
from typing import Any

__all__ = ["SKIPPED_EXTRAS", "defer_asyncio", "skip_extras"]

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


_TOLD: set[str] = set()  # the deferred modules whose first use was logged


class _Deferred(ModuleType):
    """A stand-in for a module no code of this process is meant to use (see above)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # the import system's probes load nothing
        sub = f"{self.__name__}.{name}"
        if sub in sys.modules or PathFinder.find_spec(sub, self.__path__) is not None:
            # A submodule (`from . import events` inside one, or `asyncio.events`): imported
            # as itself, as the real package's `__init__` would later reuse it.
            return importlib.import_module(sub)
        real = sys.modules.get(self.__name__)
        if real is None or real is self:
            real = _load_real(self.__name__)
        if self.__name__ not in _TOLD:
            _TOLD.add(self.__name__)
            import structlog

            structlog.get_logger().info(
                f"{self.__name__} imported on first use", attribute=name
            )
        return getattr(real, name)


def _load_real(name: str) -> ModuleType:
    """Import the real package `name` in place of its stand-in, as the import system would,
    except that the submodules already imported through the stand-in are in its namespace
    before its `__init__` runs (it names them: `from .events import *` binds `events` only
    when it imports it)."""
    spec = PathFinder.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    module = importlib.util.module_from_spec(spec)
    prefix = f"{name}."
    for key, sub in list(sys.modules.items()):
        if key.startswith(prefix) and "." not in key[len(prefix) :]:
            setattr(module, key[len(prefix) :], sub)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


class _DeferredLoader(Loader):
    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = _Deferred(spec.name)
        module.__path__ = list(spec.submodule_search_locations or ())
        return module

    def exec_module(self, module: ModuleType) -> None:
        return None


class _DeferFinder:
    """A meta path finder that hands out the stand-in for `asyncio`, once."""

    @classmethod
    def find_spec(
        cls, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != "asyncio":
            return None
        sys.meta_path.remove(cls)  # the real one is found the usual way from now on
        real = PathFinder.find_spec(name)
        if real is None or real.submodule_search_locations is None:
            return real
        spec = ModuleSpec(name, _DeferredLoader(), is_package=True)
        spec.submodule_search_locations = real.submodule_search_locations
        return spec


def defer_asyncio() -> None:
    """Import `asyncio` only when something reads it (see above); a no-op once imported."""
    if "asyncio" not in sys.modules and _DeferFinder not in sys.meta_path:
        sys.meta_path.insert(0, _DeferFinder)
