"""Each subpackage's `__init__` docstring says what it owns, receives and sends (issue 21), and
each process's docstring names every internal message it receives and sends."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from shardq.runtime._messages import MESSAGES

SHARDQ = Path(__file__).resolve().parents[1] / "shardq"
PARTS = ("Owns:", "Receives:", "Sends:")
# Subpackages whose docstring does not have the three parts yet, each with why. The test fails
# once one has them, so that the entry goes.
PENDING: dict[str, str] = {}
# A process subpackage -> how `shardq.runtime._messages` names it as sender or receiver.
PROCESSES = {
    "runtime/supervisor": "supervisor",
    "runtime/frontend": "front end",
    "runtime/shard": "shard",
    "runtime/writer": "writer",
    "runtime/http": "http",
}


def _subpackages() -> list[str]:
    return sorted(
        path.parent.relative_to(SHARDQ).as_posix() for path in SHARDQ.glob("*/**/__init__.py")
    )


def _parts(package: str) -> dict[str, str]:
    """`Owns:`/`Receives:`/`Sends:` -> the paragraph each starts, from the docstring."""
    doc = ast.get_docstring(ast.parse((SHARDQ / package / "__init__.py").read_text())) or ""
    found = {}
    for paragraph in doc.split("\n\n"):
        for part in PARTS:
            if paragraph.startswith(part):
                found[part] = " ".join(paragraph.removeprefix(part).split())
    return found


@pytest.mark.parametrize("package", _subpackages())
def test_every_subpackage_says_what_it_owns_receives_and_sends(package: str) -> None:
    parts = _parts(package)
    if package in PENDING:
        assert set(parts) != set(PARTS), f"{package} has its three parts: drop it from PENDING"
        return
    assert list(parts) == list(PARTS), f"{package}: the docstring needs Owns:, Receives:, Sends:"
    assert all(len(text) > 20 for text in parts.values()), package


def test_the_scan_sees_every_subpackage() -> None:
    found = _subpackages()
    assert {"protocol", "storage", "client", "runtime", "backup", "tasks"} <= set(found)
    assert set(PROCESSES) | {"runtime/links", "core"} <= set(found)
    assert set(PENDING) <= set(found)


def _roles(who: str) -> set[str]:
    """The processes a message's sender or receiver names: "every child" is all but the
    supervisor; "supervisor (or the front end's own link watcher)" is the supervisor."""
    if who == "every child":
        return set(PROCESSES.values()) - {"supervisor"}
    return {role for role in PROCESSES.values() if who.split(" (")[0] == role}


def _named(text: str) -> set[str]:
    return {m.t for m in MESSAGES if f"`{m.t}`" in text}


@pytest.mark.parametrize("package", sorted(PROCESSES))
def test_each_process_names_the_messages_it_receives_and_sends(package: str) -> None:
    role, parts = PROCESSES[package], _parts(package)
    between = [m for m in MESSAGES if _roles(m.sender) != _roles(m.receiver)]  # not `writer-up`
    receives = {m.t for m in between if role in _roles(m.receiver)}
    # "every child" sends `ready` and may send `progress` and `fatal`: `ready` at least.
    sends = {m.t for m in between if role in _roles(m.sender) and m.sender != "every child"}
    if role != "supervisor":
        sends.add("ready")
    assert receives <= _named(parts["Receives:"]), package
    assert sends <= _named(parts["Sends:"]), package
