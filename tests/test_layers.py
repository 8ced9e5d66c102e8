"""The import graph of `shardq` (and of `bench/`), drawn from the source: no circle, no
import from a lower layer to a higher one.

Each module is parsed with `ast`; every `import` and `from ... import` counts, at the top of the
file or inside a function (a lazy import still ties the two modules together), with relative
imports resolved against the module's package. `from pkg import name` is an edge to
`pkg.name` when that is a module, else to `pkg` (its `__init__`). Imports under
`if TYPE_CHECKING:` are left out of the rules: they never run, and annotations naming a type
of the module that uses them are the usual shape of a callback object. They are drawn in a
separate graph whose circles must be the known ones listed below, so a new one still fails.

The layers, bottom to top (a module may import its own layer and the layers below):
the root's private modules (`shardq.errors`, `shardq._version`, `shardq._logging`) <
`shardq.protocol` < `shardq.core` < `shardq.storage` < `shardq.client` and `shardq.cluster` <
`shardq.runtime` and `shardq.backup` < `shardq.tasks` < the root `shardq/__init__.py`
(its lazy re-exports of the task API). On top of the order, each subpackage may reach only the
subpackages its design gives it: the core is pure and knows only the protocol; storage stores
the core's types; the cluster's lease statements run on the store's PostgreSQL connection
type; the client speaks the protocol and knows nothing of the server; the task API
is built on the client.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_BOTTOM = "(root private modules)"
# The layer of each subpackage, and the subpackages (besides its own and the bottom) it may
# import. A module directly under shardq/ other than __init__ is at the bottom.
LAYERS: Mapping[str, int] = {
    _BOTTOM: 0,
    "shardq.protocol": 1,
    "shardq.core": 2,
    "shardq.storage": 3,
    "shardq.client": 4,
    "shardq.cluster": 4,
    "shardq.runtime": 5,
    "shardq.backup": 5,
    "shardq.tasks": 6,
    "shardq": 7,
}
MAY_IMPORT: Mapping[str, frozenset[str]] = {
    _BOTTOM: frozenset(),
    "shardq.protocol": frozenset(),
    "shardq.core": frozenset({"shardq.protocol"}),
    "shardq.storage": frozenset({"shardq.protocol", "shardq.core"}),
    "shardq.client": frozenset({"shardq.protocol"}),
    "shardq.cluster": frozenset({"shardq.protocol", "shardq.storage"}),
    "shardq.backup": frozenset({"shardq.protocol", "shardq.core", "shardq.storage"}),
    "shardq.runtime": frozenset(
        {
            "shardq.protocol",
            "shardq.core",
            "shardq.storage",
            "shardq.client",
            "shardq.cluster",
            "shardq.backup",
        }
    ),
    "shardq.tasks": frozenset({"shardq.protocol", "shardq.client"}),
    "shardq": frozenset({"shardq.tasks"}),
}

# Circles that exist only through `if TYPE_CHECKING:` imports, each with why it is still there.
# Remove an entry when its circle goes (the test fails on a stale entry too).
KNOWN_TYPING_CIRCLES: Mapping[frozenset[str], str] = {
    frozenset({"shardq.tasks._app", "shardq.tasks._canvas", "shardq.tasks._periodic"}): (
        "signatures and schedules annotate the App and Task they belong to; "
        "at run time they receive them as arguments"
    ),
}


def _modules(top: str) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module under the directory `top`."""
    found = {}
    for path in (ROOT / top).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    nodes: Iterable[ast.AST], typing_only: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements in `nodes`, at any depth: those that run, or with `typing_only`
    those under `if TYPE_CHECKING:` (whose `else:` branch runs, and counts as such)."""
    for node in nodes:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            if typing_only:
                for statement in node.body:
                    yield from (n for n in ast.walk(statement) if _is_import(n))  # type: ignore[misc]
            yield from _imports(node.orelse, typing_only)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if not typing_only:
                yield node
        else:
            yield from _imports(ast.iter_child_nodes(node), typing_only)


def _is_import(node: ast.AST) -> bool:
    return isinstance(node, ast.Import | ast.ImportFrom)


def _targets(
    node: ast.Import | ast.ImportFrom, name: str, package: bool, known: Mapping[str, object]
) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    module = node.module or ""
    if node.level:
        base = (name if package else name.rpartition(".")[0]).split(".")
        base = base[: len(base) - (node.level - 1)]
        module = ".".join([*base, *([module] if module else [])])
    for alias in node.names:
        sub = f"{module}.{alias.name}"
        yield sub if sub in known else module


def import_graph(top: str, typing_only: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports (see the module docstring)."""
    return {name: set(targets) for name, targets in _drawn(top, typing_only).items()}


@functools.cache  # parsing every module once is enough for all the tests
def _drawn(top: str, typing_only: bool) -> dict[str, frozenset[str]]:
    modules = _modules(top)
    graph: dict[str, frozenset[str]] = {}
    for name, (path, package) in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets: set[str] = set()
        for node in _imports([tree], typing_only):
            targets.update(_targets(node, name, package, modules))
        graph[name] = frozenset(t for t in targets if t in modules and t != name)
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def _part(module: str) -> str:
    """The layer key of a `shardq` module: its subpackage, the root, or the bottom."""
    parts = module.split(".")
    if len(parts) == 1:
        return "shardq"
    sub = ".".join(parts[:2])
    return sub if sub in LAYERS else _BOTTOM


def test_the_graph_sees_what_the_package_imports() -> None:
    # Guards the drawing itself: edges the test relies on exist, lazy ones included.
    graph = import_graph("shardq")
    assert "shardq.tasks" in graph["shardq"]  # inside __getattr__
    assert "shardq._version" in graph["shardq"]
    assert any(_part(t) == "shardq.protocol" for m in graph if _part(m) == "shardq.core"
               for t in graph[m])  # fmt: skip
    assert "shardq._logging" in graph["shardq.tasks._worker"]  # inside a function
    typing_graph = import_graph("shardq", typing_only=True)
    assert "shardq.tasks._app" in typing_graph["shardq.tasks._periodic"]
    assert "shardq.tasks._app" not in graph["shardq.tasks._periodic"]


def test_no_import_circle_in_shardq() -> None:
    assert circles(import_graph("shardq")) == []


def test_no_import_circle_in_bench() -> None:
    assert circles(import_graph("bench")) == []


def test_circles_through_type_checking_imports_are_the_known_ones() -> None:
    graph = import_graph("shardq")
    for source, targets in import_graph("shardq", typing_only=True).items():
        graph[source] |= targets
    found = set(circles(graph))
    assert found - set(KNOWN_TYPING_CIRCLES) == set(), "a new circle: break it"
    assert set(KNOWN_TYPING_CIRCLES) - found == set(), "gone: remove it from the list"


def test_no_import_goes_up_a_layer_or_across_the_design() -> None:
    wrong = []
    for source, targets in import_graph("shardq").items():
        mine = _part(source)
        for target in targets:
            theirs = _part(target)
            if theirs in (mine, _BOTTOM):
                continue
            if LAYERS[theirs] > LAYERS[mine] or theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{source} -> {target}")
    assert sorted(wrong) == []


def test_the_bottom_layer_imports_nothing_of_shardq_above_it() -> None:
    graph = import_graph("shardq")
    bottom = [m for m in graph if _part(m) == _BOTTOM]
    assert {"shardq.errors", "shardq._version", "shardq._logging"} <= set(bottom)
    assert {m: graph[m] for m in bottom if graph[m] - set(bottom)} == {}


def test_a_planted_circle_and_upward_import_are_caught() -> None:
    # The checks above pass on an empty answer; this shows they can fail.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [frozenset({"a", "b", "c"})]
    assert _part("shardq.core._engine") == "shardq.core"
    assert _part("shardq._version") == _BOTTOM
    assert _part("shardq") == "shardq"
    assert "shardq.runtime" not in MAY_IMPORT["shardq.core"]
