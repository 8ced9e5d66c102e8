"""Smoke test of `python -m bench.delay_clients_ab`: two clients (here the same interpreter
twice) take alternated rounds against one server and both are reported. It asserts the shape
of the report, never a speed."""

from __future__ import annotations

import re
import subprocess
import sys
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
