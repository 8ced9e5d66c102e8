"""The HTTP port's header timeout against a stalled server: headers that arrived in time are
answered even when the HTTP process itself was stopped past the timeout between accepting the
connection and reading them (its header timer and their bytes are then due in one turn)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports_helpers import raw_request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, free_port, poll_until

HEADER_TIMEOUT_MS = 1000
STALL_S = 2.5  # well past the header timeout


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    env = {"SHARDQ_HTTP_HEADER_TIMEOUT_MS": str(HEADER_TIMEOUT_MS)}
    srv = ShardqServer(tmp_path_factory.mktemp("stall"), shards=1, http_port=free_port(), env=env)
    srv.start(timeout=60)
    try:
        yield srv
    finally:
        srv.close()


def _accepted_by(pid: int, client: socket.socket) -> bool:
    """Whether process `pid` holds the server end of `client`'s connection (`ss`): accepted,
    not just queued in the listen backlog."""
    port = client.getsockname()[1]
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( dport = :{port} )"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return f"pid={pid}," in out.stdout


def test_headers_in_time_are_answered_after_a_stall_past_the_header_timeout(
    server: ShardqServer,
) -> None:
    http = server.child_pids()["http"]
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        poll_until(lambda: _accepted_by(http, sock), 10, "the HTTP process to accept")
        os.kill(http, signal.SIGSTOP)
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # in time, all at once
            time.sleep(STALL_S)
        finally:
            os.kill(http, signal.SIGCONT)
        status, _ = raw_request(sock, b"", timeout=10)
    assert status == 200
    assert server.stop() == 0
