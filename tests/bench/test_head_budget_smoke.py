"""Smoke test of `python -m bench.head_budget` at a tiny size: both settings run end to end.

It asserts the shape of the results (every phase measured, every job drained), never a speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOBS = 3000


def test_head_budget_bench_measures_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "head.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.head_budget", "--jobs", str(JOBS), "--batch", "500",
         "--head-jobs", "0", "100", "--settle", "0", "--dir", str(tmp_path),
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = {row["head_jobs"]: row for row in result["rows"]}
    assert sorted(rows) == [0, 100]
    for row in rows.values():
        assert "error" not in row
        assert row["drained"] == JOBS and row["first_ping_s"] > 0
        assert row["stop_exit"] == 0 and row["final_exit"] == 0
        for phase in ("rss_after_push", "rss_after_restart", "rss_after_drain", "rss_settled",
                      "peak_first_run", "peak_second_run"):  # fmt: skip
            assert {"writer", "shard0", "shard1", "frontend"} <= set(row[phase])
        assert row["db_mb_after_push"] > 0 and row["db_mb_after_drain"] > 0
    assert "| 100 | 3,000 |" in done.stdout  # the table row of the budgeted run
