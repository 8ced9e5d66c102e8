"""Smoke test of `python -m bench.cpu_ab`: this build against itself, tiny runs, every row.

It asserts the shape of the table, never a speed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardq.client import ServerError, TcpConnection

REPO = Path(__file__).resolve().parents[2]
SHARDQ = str(Path(sys.executable).parent / "shardq")


def test_cpu_ab_reports_each_build_and_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cpu_ab", "--build", f"a={SHARDQ}", "--build",
         f"b={SHARDQ}", "--scenario", "push8q,drain1q", "--jobs", "3000", "--rounds", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    table, summary = done.stdout.split("\n\n")
    rows = [line.strip("| ").split(" | ") for line in table.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("push8q", "a"), ("push8q", "b"), ("drain1q", "a"), ("drain1q", "b")
    ]  # fmt: skip
    for row in rows:
        rate, front, shards, writer, total = (float(c.replace(",", "")) for c in row[2:])
        # CPU time comes in clock ticks (10 ms): a tiny run may show 0 for one process.
        assert rate > 0 and min(front, shards, writer) >= 0 and total > 0
        assert abs(total - (front + shards + writer)) < 0.2
    # The summary: b against a for each scenario, one paired ratio per round, and a verdict.
    verdicts = [line.strip("| ").split(" | ") for line in summary.splitlines()[2:]]
    assert [(v[0], v[1]) for v in verdicts] == [("push8q", "b"), ("drain1q", "b")]
    for v in verdicts:
        assert float(v[3]) > 0 and len(v[4].split()) == 1 and v[5].startswith("±")
        assert v[6] in ("slower beyond the noise", "within the noise or faster")


def test_cpu_ab_refuses_an_unknown_scenario() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cpu_ab", "--build", f"a={SHARDQ}", "--scenario", "nope"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "unknown scenario(s): nope" in done.stderr


def test_instructions_are_counted_for_a_process_and_its_children(tmp_path: Path) -> None:
    """What `--instructions` runs a server under, on a process that starts another: the
    server-level part of the tool (start, fill, work) is the CPU mode's, tested above."""
    from bench._instructions import read_totals, valgrind_wrapper

    child = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"
    done = subprocess.run(
        [*valgrind_wrapper(tmp_path), sys.executable, "-c", child],
        capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    counts = [read_totals(path) for path in tmp_path.glob("ir.*")]
    # Python starting up runs some tens of millions of instructions; both processes counted.
    assert len(counts) == 2 and min(counts) > 10_000_000


def test_read_totals_reads_a_cachegrind_file(tmp_path: Path) -> None:
    from bench._instructions import read_totals

    out = tmp_path / "ir.1"
    out.write_bytes(b"desc: I1 cache: 32768 B\ncmd: python3 -m x\nevents: Ir\nsummary: 123456\n")
    assert read_totals(out) == 123456
    out.write_bytes(b"version: 1\nevents: Ir\n")
    with pytest.raises(ValueError, match="no instruction count"):
        read_totals(out)


def test_children_are_told_apart_by_command_line_after_a_restart(tmp_path: Path) -> None:
    """A shard killed and restarted starts after the front end; it must still count as a
    shard, and the front end as the front end (start order would swap them)."""
    import os
    import signal

    sys.path.insert(0, str(REPO))
    from bench._scenarios import children, connect, start_server

    server, port = start_server(SHARDQ, 2, str(tmp_path))
    try:
        conn = connect(port, server)
        before = dict(children(server.pid))
        shard = next(pid for pid, role in before.items() if role == "shard0")
        os.kill(shard, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            after = children(server.pid)
            if len(after) == 4 and shard not in dict(after):
                break
            assert time.monotonic() < deadline, f"no restarted shard: {after}"
            time.sleep(0.1)
        roles = dict(after)
        restarted = max(roles)
        assert roles[restarted] in ("shard0", "shard1")  # the newest process is the new shard
        assert sorted(roles.values()) == ["frontend", "shard0", "shard1", "writer"]
        for pid, role in after:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert f"shardq.runtime.{role.rstrip('01')}".encode() in f.read()
        # Stopped only once the new shard serves: a SIGTERM while it is still restarting
        # leaves the front end waiting out its whole drain timeout (30 s) for that shard.
        _wait_until_every_shard_answers(conn)
        conn.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def _wait_until_every_shard_answers(conn: TcpConnection) -> None:
    """Stats asks every shard; "Shard unavailable" until a restarted one is back (bounded)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            conn.call({"cmd": "Stats"})
            return
        except ServerError as e:
            assert "unavailable" in str(e) and time.monotonic() < deadline, e
        time.sleep(0.05)
