"""`bench._scenarios.start_server` keeps the server's stderr: a bench whose server dies at start
says why (`connect` adds the stderr's tail to the error it raises)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from bench._scenarios import connect, queues_of, start_server, stderr_tail, work
from shardq.client import ConnectionLost

SHARDQ = shutil.which("shardq") or str(Path(sys.executable).with_name("shardq"))


def test_a_server_that_dies_at_start_says_why(tmp_path: Path) -> None:
    first, port = start_server(SHARDQ, 1, str(tmp_path))
    try:
        connect(port, first).close()
        # A second server on the same data dir refuses to start: the data file is locked.
        second, second_port = start_server(SHARDQ, 1, str(tmp_path))
        with pytest.raises((OSError, ConnectionLost)) as raised:
            connect(second_port, second, timeout_s=30)
        assert second.wait(timeout=10) != 0
        notes = "\n".join(getattr(raised.value, "__notes__", []))
        assert "is in use by another shardq server" in notes
        assert "is in use by another shardq server" in stderr_tail(second)
    finally:
        first.terminate()
        first.wait(timeout=30)


@pytest.mark.parametrize(("scenario", "durable"), [("spush1q", False), ("dpush1q", True)])
def test_one_at_a_time_scenarios_push_n_jobs_as_their_mode_says(
    tmp_path: Path, scenario: str, durable: bool
) -> None:
    """`spush1q` and `dpush1q` (`bench.cpu_ab`): N single PUSHes, buffered or durable."""
    server, port = start_server(SHARDQ, 1, str(tmp_path))
    try:
        conn = connect(port, server)
        assert work(conn, scenario, queues_of(scenario), 30) == 30
        listed = conn.call({"cmd": "GetJobs", "queue": "q0", "state": "waiting", "limit": 100})
        assert len(listed["jobs"]) == 30
        assert {job["durable"] for job in listed["jobs"]} == {durable}
        conn.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
