"""Smoke test of `python -m bench.latency`: the harness runs and reports every path.

shardq only, a few requests, one repeat; it asserts the shape of the report, never a speed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_latency_reports_the_floor_and_every_server_path(tmp_path: Path) -> None:
    out = tmp_path / "latency.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.latency", "--requests", "20", "--repeats", "1",
         "--peers", "shardq", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(out.read_text())
    paths = [(row["peer"], row["path"]) for row in rows]
    assert paths == [
        ("floor", "Unix socket echo (asyncio <-> poll)"),
        ("floor", "ZeroMQ PUSH/PULL ipc echo"),
        ("shardq", "Ping"),
        ("shardq", "Count"),
        ("shardq", "PUSH"),
        ("shardq", "PUSH durable"),
    ]
    for row in rows:
        assert 0 < row["p50_us"] <= row["p90_us"] <= row["p99_us"]
        assert row["rate"] > 0
    assert "| shardq | PUSH durable |" in done.stdout


def test_latency_refuses_an_unknown_peer() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.latency", "--peers", "shardq,redis"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "unknown peers: redis" in done.stderr


def test_the_unix_echo_path_appears_only_once_it_listens(tmp_path: Path) -> None:
    """CI once saw the floor's client refused: it connected between the echo's bind and listen."""
    from bench.latency import _echo_child, _wait_for

    path = tmp_path / "echo.sock"
    with _echo_child("--echo-unix", str(path)):
        _wait_for(path)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # refused if the path came before listen
            client.sendall(b"ping")
            assert client.recv(16) == b"ping"


def test_an_echo_child_is_killed_when_its_block_fails(tmp_path: Path) -> None:
    """A child left running holds the caller's pipes: the smoke test then waited 120 s, not 1."""
    from bench.latency import _echo_child

    started = time.monotonic()
    with pytest.raises(RuntimeError), _echo_child("--echo-unix", str(tmp_path / "e.sock")) as echo:
        raise RuntimeError("the client failed")
    assert echo.poll() is not None
    assert time.monotonic() - started < 9  # killed, not waited out (its wait is 10 s)
