"""The marker rewrite shared by the docs' generators (`shardq/_docgen.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardq._docgen import regenerate, replace_block

BEGIN, END = "<!-- x:begin -->", "<!-- x:end -->"


def test_replace_block_keeps_the_prose_around_it() -> None:
    text = f"intro\n{BEGIN}\nold\n{END}\nafter {END}\n"
    new = f"{BEGIN}\nnew\n{END}"
    assert replace_block(text, BEGIN, END, new) == f"intro\n{new}\nafter {END}\n"


@pytest.mark.parametrize(
    ("text", "missing"), [("no markers", BEGIN), (f"{BEGIN} only", END), (f"{END} {BEGIN}", END)]
)
def test_a_missing_marker_is_named(text: str, missing: str) -> None:
    with pytest.raises(ValueError, match=f"marker line not found: {missing}"):
        replace_block(text, BEGIN, END, "x")


def test_regenerate_checks_then_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(f"a {BEGIN} old {END} b", encoding="utf-8")

    def rewrite(text: str) -> str:
        return replace_block(text, BEGIN, END, f"{BEGIN} new {END}")

    assert regenerate(doc, rewrite, ["--check"], "stale!") == 1
    assert capsys.readouterr().out == "stale!\n"
    assert "old" in doc.read_text(encoding="utf-8")  # --check never writes
    assert regenerate(doc, rewrite, [], "stale!") == 0
    assert doc.read_text(encoding="utf-8") == f"a {BEGIN} new {END} b"
    assert regenerate(doc, rewrite, ["--check"], "stale!") == 0
