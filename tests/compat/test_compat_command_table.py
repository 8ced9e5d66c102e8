"""docs/protocol.md §22 lists all 107 bunqueue commands with shardq's status; this keeps it true.

The table must name exactly `BUNQUEUE_COMMANDS`, in its order, and a command is "not yet" in the
table exactly when a real server answers it `Unsupported command: <name>`.
"""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ShardqServer

from shardq.client import Connection
from shardq.runtime.frontend._commands import BUNQUEUE_COMMANDS

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
ROW = re.compile(r"^\| (\d+) \| `(\w+)` \| (served|not yet) \| (.+) \|$")
SOURCE = Path(__file__).resolve().parents[2] / "shardq" / "runtime" / "frontend" / "_commands.py"


def table() -> list[tuple[str, str]]:
    text = DOC.read_text()
    section = text[text.index("## 22. Command table") :]
    rows = [m for line in section.splitlines() if (m := ROW.match(line))]
    assert [int(m[1]) for m in rows] == list(range(1, len(rows) + 1))
    return [(m[2], m[3]) for m in rows]


def declared_order() -> list[str]:
    source = SOURCE.read_text()
    block = source[
        source.index("BUNQUEUE_COMMANDS: Final") : source.index("ENGINE_COMMANDS: Final")
    ]
    return re.findall(r'^\s+"(\w+)",$', block, re.MULTILINE)


def test_table_names_every_command_once_in_code_order() -> None:
    names = [name for name, _ in table()]
    assert len(names) == 107 == len(BUNQUEUE_COMMANDS)
    assert names == declared_order()
    assert set(names) == BUNQUEUE_COMMANDS


def test_status_matches_what_the_server_answers(shared_server: ShardqServer) -> None:
    host, port = shared_server.tcp_address
    rows = table()
    conn = Connection(f"tcp://{host}:{port}")
    try:
        # Bare commands: a served one fails its validation or does nothing harmful.
        replies = conn.call_many([{"cmd": name} for name, _ in rows], check=False)
    finally:
        conn.close()
    answered = {
        name: "not yet" if reply.get("error") == f"Unsupported command: {name}" else "served"
        for (name, _), reply in zip(rows, replies, strict=True)
    }
    assert {n: s for n, s in rows if answered[n] != s} == {}
    assert sum(s == "served" for _, s in rows) >= 80
