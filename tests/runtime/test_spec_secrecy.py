"""Children get their spec (auth tokens included) on stdin, never on their command line."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from shardq_harness import ShardqServer

from shardq.runtime._child import parse_spec_args
from shardq.runtime._spec import ChildSpec

Factory = Callable[..., ShardqServer]


def test_spec_dash_reads_standard_input() -> None:
    spec = ChildSpec(role="writer", run_dir="/tmp/r", data_path="/tmp/d.db", shards=2)
    parsed = parse_spec_args(["--spec", "-"], stdin=io.StringIO(spec.to_json()))
    assert parsed == spec


def test_no_command_line_holds_the_auth_token(shardq_server: Factory, tmp_path: Path) -> None:
    token = "s3cret-token-for-the-test"
    tokens = tmp_path / "tokens"
    tokens.write_text(token + "\n")
    server = shardq_server(shards=2, args=("--auth-token-file", str(tokens)))
    children = server.child_pids()
    assert set(children) == {"writer", "shard-0", "shard-1", "frontend"}
    supervisor = Path(f"/proc/{server.pid}/cmdline").read_bytes()
    assert token.encode() not in supervisor
    for name, pid in children.items():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert token not in cmdline, f"{name}'s command line shows the token"
        assert "--spec -" in cmdline
    assert server.stop() == 0
