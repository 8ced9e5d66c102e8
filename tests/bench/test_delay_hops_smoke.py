"""Smoke test of `python -m bench.delay_hops`: it runs and reports the client and the server's
busy processes. It asserts the shape of the report, never a speed or a count (the client's
system calls per push are checked in tests/client/test_sync_hops.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_delay_hops_reports_the_client_and_the_shard() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.delay_hops", "--calls", "50"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    number = r"[\d.]+"
    assert re.search(rf"\| client \([\d,]+ calls/s\) \| {number} \| {number} \| {number} \|",
                     done.stdout), done.stdout  # fmt: skip
    assert re.search(rf"\| shard \| {number} \| {number} \| {number} \|", done.stdout), done.stdout
