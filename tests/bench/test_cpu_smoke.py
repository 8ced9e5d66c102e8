"""Smoke test of `python -m bench.cpu`: a real server, one short run, a table of CPU per job.

It asserts the shape of the table, never a speed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cpu_bench_reports_every_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cpu", "--seconds", "0.5", "--repeats", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    median = [line for line in done.stdout.splitlines() if line.startswith("| median |")]
    assert len(median) == 1
    cells = [float(c.replace(",", "")) for c in median[0].strip("| \n").split("|")[1:]]
    writer, shards, frontend, client, jobs_per_s = cells
    # The front end's column is there, but may read 0: its one connection pushes, pulls and
    # acks for one shard, so the front end hands it to that shard (`tcp_handoff`).
    assert writer > 0 and shards > 0 and frontend >= 0 and client > 0 and jobs_per_s > 0
