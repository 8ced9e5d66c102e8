"""The writer's per-commit debug line ("flushed") is written at `log_level = debug` and not
at the default level; the writer asks its logger once whether debug is on (a call per commit
would bind a logger each time). On a real server, through its stderr."""

from __future__ import annotations

from collections.abc import Callable

from shardq_harness import ShardqServer

from shardq.client import TcpConnection

PUSHES = 5


def flushed_lines(server: ShardqServer) -> list[dict[str, object]]:
    return [
        line
        for line in server.logs()
        if line.get("event") == "flushed" and str(line.get("role")) == "writer"
    ]


def durable_pushes(server: ShardqServer) -> None:
    with TcpConnection(*server.tcp_address) as conn:
        for n in range(PUSHES):
            reply = conn.call({"cmd": "PUSH", "queue": "dbg", "data": {"n": n}, "durable": True})
            assert reply["ok"] and reply["id"], reply


def test_the_commit_line_is_written_at_debug(shardq_server: Callable[..., ShardqServer]) -> None:
    server = shardq_server(shards=1, args=["--log-level", "debug"])
    durable_pushes(server)
    assert server.stop() == 0, server.log_tail()
    lines = flushed_lines(server)
    assert lines, server.log_tail()
    assert sum(int(str(line["mutations"])) for line in lines) >= PUSHES, lines
    assert all(line["level"] == "debug" and "ms" in line for line in lines), lines


def test_the_commit_line_is_left_out_at_info(shardq_server: Callable[..., ShardqServer]) -> None:
    server = shardq_server(shards=1)
    durable_pushes(server)
    assert server.stop() == 0, server.log_tail()
    assert flushed_lines(server) == []
    assert any(line.get("event") == "writer stopping" for line in server.logs())
