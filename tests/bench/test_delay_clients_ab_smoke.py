"""Smoke test of `python -m bench.delay_clients_ab`: two clients (here the same interpreter
twice) take alternated rounds against one server and both are reported. It asserts the shape
of the report, never a speed."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_clients_are_reported_round_by_round() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.delay_clients_ab", "--rounds", "2", "--calls", "20",
         "--client", f"a={sys.executable}", "--client", f"b={sys.executable}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    for label in ("a", "b"):
        row = re.search(rf"\| {label} \| ([\d,]+) \([\d,]+-[\d,]+\) \| [\d.]+ \| [\d.]+ \|",
                        done.stdout)  # fmt: skip
        assert row is not None and int(row.group(1).replace(",", "")) > 0, done.stdout
    assert re.search(r"b against a, round by round: faster in \d/2, less client CPU in \d/2",
                     done.stdout), done.stdout  # fmt: skip


def test_a_client_that_does_not_exit_is_killed(tmp_path: Path) -> None:
    """A client stuck (here one that ignores the end of its input) is killed after its grace:
    left running, it holds the bench's stderr and the test above waits out its 120 s."""
    from bench.delay_clients_ab import Client

    stuck = tmp_path / "stuck-python"
    stuck.write_text("#!/bin/sh\necho ready\nexec sleep 60\n")
    stuck.chmod(0o755)
    client = Client("stuck", str(stuck))
    client.start("tcp://127.0.0.1:1")  # it reads "ready", as from a warmed-up client
    started = time.monotonic()
    client.stop(grace=1.0)
    assert client.proc is not None and client.proc.poll() == -9
    assert time.monotonic() - started < 30  # killed, not waited out
