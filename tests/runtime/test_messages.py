"""The internal messages are declared once (`shardq/runtime/_messages.py`): every `{"t": ...}`
map is built there, every process dispatches on its constants, the frames are the maps they
were, and docs/runtime.md's table is the module's."""

from __future__ import annotations

import ast
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest

from shardq.core import Engine
from shardq.runtime import _messages as msgs
from shardq.runtime import _messages_doc
from shardq.runtime.links._control import pack
from shardq.runtime.shard._core import ShardCore

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "shardq" / "runtime" / "_messages.py"
KINDS = frozenset(m.t for m in msgs.MESSAGES)

# One call of each constructor, and the map the code built by hand before the module existed.
SAMPLES: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
    (msgs.ready, ("shard", 1, 42, None), {"t": "ready", "role": "shard", "index": 1, "pid": 42}),
    (
        msgs.ready,
        ("front", 0, 7, {"tcp": "h:1"}),
        {"t": "ready", "role": "front", "index": 0, "pid": 7, "addresses": {"tcp": "h:1"}},
    ),
    (
        msgs.progress,
        ("shard", 0, 9, 5, None),
        {"t": "progress", "role": "shard", "index": 0, "pid": 9, "loaded": 5},
    ),
    (
        msgs.fatal,
        ("writer", 0, 3, "boom"),
        {"t": "fatal", "role": "writer", "index": 0, "pid": 3, "error": "boom"},
    ),
    (
        msgs.recycled,
        ("shard", 1, 8, 1 << 20),
        {"t": "recycled", "role": "shard", "index": 1, "pid": 8, "rss": 1 << 20},
    ),
    (msgs.recycle, (1,), {"t": "recycle", "shard": 1}),
    (msgs.recycle_go, (), {"t": "recycle-go"}),
    (msgs.recycle_off, (3,), {"t": "recycle-off", "shard": 3}),
    (msgs.shard_down, (2,), {"t": "shard-down", "shard": 2}),
    (msgs.shard_up, (2,), {"t": "shard-up", "shard": 2}),
    (
        msgs.req,
        ([["t1", 1, {"cmd": "Ping"}]],),
        {"t": "req", "items": [["t1", 1, {"cmd": "Ping"}]]},
    ),
    (msgs.close, ("t1",), {"t": "close", "conn": "t1"}),
    (msgs.unpark, ("t1",), {"t": "unpark", "conn": "t1"}),
    (
        msgs.cancel_for,
        ([{"conn": "t1", "hops": 1}],),
        {"t": "cancel-for", "items": [{"conn": "t1", "hops": 1}]},
    ),
    (msgs.drain, (), {"t": "drain"}),
    (msgs.listen, (False, ["q"]), {"t": "listen", "all": False, "queues": ["q"]}),
    (msgs.workers, (["q"],), {"t": "workers", "queues": ["q"]}),
    (msgs.flowack, (["k"],), {"t": "flowack", "keys": ["k"]}),
    (msgs.parts, ([1, 7], [3, 1]), {"t": "parts", "held": [1, 7], "epochs": [3, 1]}),
    (msgs.loaded, (2, [1], [3]), {"t": "loaded", "shard": 2, "held": [1], "epochs": [3]}),
    (msgs.rep, ([["t1", 1, {"ok": True}]],), {"t": "rep", "items": [["t1", 1, {"ok": True}]]}),
    (msgs.events, ([{"event": "x"}],), {"t": "events", "items": [{"event": "x"}]}),
    (msgs.cancel, ([{"conn": "t1"}],), {"t": "cancel", "items": [{"conn": "t1"}]}),
    (msgs.drained, (1,), {"t": "drained", "shard": 1}),
    (msgs.flow, (1, [["k", {}]]), {"t": "flow", "shard": 1, "items": [["k", {}]]}),
    (msgs.direct, (1, 40000), {"t": "direct", "shard": 1, "port": 40000}),
    (msgs.handoff, ("t1.2", b"\0\0"), {"t": "handoff", "conn": "t1.2", "unread": b"\0\0"}),
    (msgs.took, ("t1.2", True), {"t": "took", "conn": "t1.2", "ok": True}),
    (msgs.handback, ("t1.2", b""), {"t": "handback", "conn": "t1.2", "unread": b""}),
    (msgs.gone, ("t1.2",), {"t": "gone", "conn": "t1.2"}),
    (
        msgs.muts,
        (0, 3, [["del", "j1"]]),
        {"t": "muts", "shard": 0, "seq": 3, "muts": [["del", "j1"]]},
    ),
    (msgs.flush, (0, 3), {"t": "flush", "shard": 0, "seq": 3}),
    (msgs.sync, (0, 0), {"t": "sync", "shard": 0, "seq": 0}),
    (msgs.done, (4,), {"t": "done", "seq": 4}),
    (msgs.fail, (4, "full"), {"t": "fail", "seq": 4, "error": "full"}),
    (
        msgs.rejected,
        (4, [["put", "j", "e"]]),
        {"t": "rejected", "seq": 4, "items": [["put", "j", "e"]]},
    ),
    (msgs.writer_up, (), {"t": "writer-up"}),
    (msgs.front, (), {"t": "front", "shard": -1, "seq": 0}),
]


def _python_files() -> Iterator[Path]:
    for path in sorted((ROOT / "shardq").rglob("*.py")):
        if path != MODULE:
            yield path


def _is_message_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == "t" for k in node.keys)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "dict"
        and any(k.arg == "t" for k in node.keywords)
    )


def message_literals(tree: ast.AST) -> list[int]:
    """Lines of every `{"t": ...}` literal and `dict(t=...)` call in `tree`."""
    return sorted(n.lineno for n in ast.walk(tree) if _is_message_literal(n))  # type: ignore[attr-defined]


def _reads_kind(node: ast.AST) -> bool:
    """`x.get("t")` or `x["t"]`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "get" and any(
            isinstance(a, ast.Constant) and a.value == "t" for a in node.args[:1]
        )
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and node.slice.value == "t"
    )


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def kind_strings(tree: ast.AST) -> list[int]:
    """Lines that dispatch on a kind spelled as a string: a comparison of a message's `t`
    with a literal, or a table whose keys are all kind names."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_reads_kind(s) for s in sides) and any(_strings(s) for s in sides):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and len(node.keys) >= 2:
            keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
            if all(k in KINDS for k in keys):
                lines.append(node.lineno)
    return lines


def test_no_message_literal_outside_the_module() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for path in _python_files()
        if (lines := message_literals(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}, "build internal messages with shardq.runtime._messages"


def test_no_dispatch_on_a_kind_spelled_as_a_string() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for path in _python_files()
        if (lines := kind_strings(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}, "dispatch on the kind constants of shardq.runtime._messages"


def test_the_scans_catch_what_they_forbid() -> None:
    planted = ast.parse(
        'a = {"t": "req", "items": []}\n'
        'b = dict(t="rep")\n'
        'if msg.get("t") == "done": pass\n'
        'if msg["t"] in ("done", "fail"): pass\n'
        'table = {"req": 1, "close": 2}\n'
        'fine = {"req": 1, "other": 2}\n'
    )
    assert message_literals(planted) == [1, 2]
    assert kind_strings(planted) == [3, 4, 5]


def test_each_kind_is_declared_once_with_its_shape() -> None:
    kinds = [m.t for m in msgs.MESSAGES]
    assert len(kinds) == len(set(kinds))
    constants = {
        getattr(msgs, name)
        for name in msgs.__all__
        if name.isupper() and name != "MESSAGES" and not name.startswith("ENVELOPE_")
    }
    assert constants == set(kinds)
    for message in msgs.MESSAGES:
        hints = typing.get_type_hints(message.shape)
        assert hints["t"] == typing.Literal[message.t], message.t
        assert "t" in message.shape.__required_keys__  # type: ignore[attr-defined]


@pytest.mark.parametrize(("build", "args", "before"), SAMPLES)
def test_constructors_build_the_maps_and_frames_of_before(
    build: Callable[..., Any], args: tuple[Any, ...], before: dict[str, Any]
) -> None:
    msg = build(*args)
    assert msg == before
    # The frame is byte for byte the one the hand-built map made (same keys, same order).
    assert pack(msg) == msgpack.packb(before, use_bin_type=True)
    declared = next(m for m in msgs.MESSAGES if m.t == msg["t"]).shape
    assert set(declared.__required_keys__) <= set(msg)  # type: ignore[attr-defined]
    assert set(msg) <= set(typing.get_type_hints(declared))


def test_every_kind_has_a_sample() -> None:
    assert {before["t"] for _, _, before in SAMPLES} == KINDS


def test_the_shard_dispatches_every_kind_sent_to_it() -> None:
    core = ShardCore(0, Engine(seed=1))
    received = {m.t for m in msgs.MESSAGES if m.receiver == "shard"}
    assert set(core._handlers) == received


def test_done_marks_the_answer_to_a_sync() -> None:
    assert msgs.done(5, synced=True) == {"t": "done", "seq": 5, "sync": True}


def test_docs_table_is_the_modules() -> None:
    text = _messages_doc.DOC.read_text(encoding="utf-8")
    assert _messages_doc.rewrite(text) == text, "run python -m shardq.runtime._messages_doc"
    for message in msgs.MESSAGES:
        assert f"| `{message.t}` |" in _messages_doc.render()


def test_check_mode_fails_on_a_stale_table_and_a_rewrite_fixes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "runtime.md"
    text = _messages_doc.DOC.read_text(encoding="utf-8")
    doc.write_text(text.replace("| `req` |", "| `request` |"), encoding="utf-8")
    monkeypatch.setattr(_messages_doc, "DOC", doc)
    assert _messages_doc.main(["--check"]) == 1
    assert _messages_doc.main([]) == 0
    assert doc.read_text(encoding="utf-8") == text
    assert _messages_doc.main(["--check"]) == 0
