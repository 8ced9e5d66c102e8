"""`shardq/core/` does no I/O and reads no clock: it imports none of the modules that could."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "shardq" / "core"
FORBIDDEN = {
    "asyncio",
    "datetime",
    "http",
    "multiprocessing",
    "os",
    "select",
    "selectors",
    "socket",
    "sqlite3",
    "sqlite_utils",
    "subprocess",
    "threading",
    "time",
    "urllib",
    "zmq",
    "shardq.runtime",
    "shardq.storage",
    "shardq.client",
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            names.add("__import__")
    return names


def is_forbidden(name: str) -> bool:
    return name == "__import__" or any(
        name == bad or name.startswith(bad + ".") for bad in FORBIDDEN
    )


SOURCES = sorted(CORE.glob("*.py"))


def test_core_has_sources() -> None:
    assert len(SOURCES) > 5


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_core_module_imports_no_io(path: Path) -> None:
    allowed = ALLOWED.get(path.name, set())
    bad = sorted(n for n in imported_modules(path) if is_forbidden(n) and n not in allowed)
    assert not bad, f"{path.name} imports {bad}"


# `_slots` turns epoch milliseconds into wall-clock times for cron expressions; it may import
# datetime, and no core module may read the clock through it (checked below).
ALLOWED = {"_slots.py": {"datetime"}, "_webhooks.py": {"urllib.parse"}}  # no I/O in either
CLOCK_READS = {"now", "today", "utcnow", "time", "monotonic", "perf_counter"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_core_module_calls_no_clock(path: Path) -> None:
    calls = {
        node.func.attr
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert not calls & CLOCK_READS, f"{path.name} calls {sorted(calls & CLOCK_READS)}"


def test_the_check_itself_catches_a_clock_read(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import time\nfrom os import path\n")
    assert {n for n in imported_modules(sample) if is_forbidden(n)} == {"time", "os"}
