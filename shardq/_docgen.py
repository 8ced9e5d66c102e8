"""The one marker rewrite behind the generated blocks of the docs.

A generated block sits between a begin and an end marker line in a Markdown file; the prose
around it is written by hand. `docs/protocol.md`'s field tables (`shardq.protocol._schema_doc`)
and `docs/runtime.md`'s message table (`shardq.runtime._messages_doc`) are both kept this way,
each with a `--check` mode that CI runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["regenerate", "replace_block"]


def replace_block(text: str, begin: str, end: str, block: str) -> str:
    """`text` with everything from `begin` through `end` replaced by `block` (which holds the
    markers itself). Raises ValueError naming a marker that is missing or out of order."""
    start = text.find(begin)
    stop = text.find(end, start + len(begin)) if start >= 0 else -1
    if start < 0 or stop < 0:
        missing = begin if start < 0 else end
        raise ValueError(f"marker line not found: {missing}")
    return text[:start] + block + text[stop + len(end) :]


def regenerate(doc: Path, rewrite: Callable[[str], str], argv: Sequence[str], stale: str) -> int:
    """A generator's command line: rewrite `doc` in place, or with `--check` print `stale` and
    return 1 if the file differs from what `rewrite` makes of it (0 otherwise)."""
    text = doc.read_text(encoding="utf-8")
    fresh = rewrite(text)
    if "--check" in argv:
        if fresh != text:
            print(stale)
            return 1
        return 0
    doc.write_text(fresh, encoding="utf-8")
    return 0
