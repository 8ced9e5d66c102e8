"""Smoke test of `python -m bench.cpu_ab`: this build against itself, tiny runs, every row.

It asserts the shape of the table, never a speed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARDQ = str(Path(sys.executable).parent / "shardq")


def test_cpu_ab_reports_each_build_and_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cpu_ab", "--build", f"a={SHARDQ}", "--build",
         f"b={SHARDQ}", "--scenario", "push8q,drain1q", "--jobs", "3000", "--rounds", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [line.strip("| ").split(" | ") for line in done.stdout.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("push8q", "a"), ("push8q", "b"), ("drain1q", "a"), ("drain1q", "b")
    ]  # fmt: skip
    for row in rows:
        rate, front, shards, writer, total = (float(c.replace(",", "")) for c in row[2:])
        # CPU time comes in clock ticks (10 ms): a tiny run may show 0 for one process.
        assert rate > 0 and min(front, shards, writer) >= 0 and total > 0
        assert abs(total - (front + shards + writer)) < 0.2


def test_cpu_ab_refuses_an_unknown_scenario() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cpu_ab", "--build", f"a={SHARDQ}", "--scenario", "nope"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "unknown scenario(s): nope" in done.stderr
