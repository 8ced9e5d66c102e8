"""Smoke test of `python -m bench.bq_ceiling`: bunqueue-client's Worker drains the stand-in
server and the harness reports each repeat. Small N; it asserts the shape of the report (and
that every job was drained), never a speed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bq_ceiling_reports_each_repeat() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bq_ceiling", "--jobs", "1000", "--repeats", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = re.findall(
        r"^repeat \d: ([0-9,]+) jobs/s, worker ([0-9.]+|nan) µs/job, stand-in ([0-9.]+|nan) µs/job",
        done.stdout,
        re.M,
    )
    assert len(rows) == 2, done.stdout
    for rate, worker, _server in rows:
        # The CPU figures are nan when the worker was done before the first look.
        assert float(rate.replace(",", "")) > 0 and not float(worker) <= 0
    assert re.search(r"^median [0-9,]+ jobs/s$", done.stdout, re.M), done.stdout
