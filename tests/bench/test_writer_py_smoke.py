"""Smoke test of `python -m bench.writer_py`: the writer's steps per job, for both shapes.

Small N; it asserts the shape of the report, never a speed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS = ("decode", "buffer", "coalesce", "rows", "sql", "begin", "commit", "remember",
         "confirm", "gc", "total")  # fmt: skip


@pytest.mark.parametrize("shape", ["ppa1q", "pushb"])
def test_the_split_reports_every_step(shape: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.writer_py", "--shape", shape, "--jobs", "2000",
         "--repeats", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    assert out.startswith(f"# {shape}, 2000 jobs, 1 runs"), out
    for step in STEPS:
        assert re.search(rf"^\| {step} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$", out, re.M), out
    sql = re.search(r"^\| sql \| ([0-9.]+) \|", out, re.M)
    rows = re.search(r"^\| rows \| ([0-9.]+) \|", out, re.M)
    assert sql is not None and rows is not None and float(sql[1]) > 0 and float(rows[1]) > 0
