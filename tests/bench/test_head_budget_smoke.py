"""Smoke test of `python -m bench.head_budget` at a tiny size: every kind of run goes end to end.

A budgeted run of this checkout and a run of a given `shardq` executable (here this checkout's
own, with no budget key in its environment, as a build from before the budget is run) in one
invocation. It asserts the shape of the results (every phase measured and sampled, every job
drained), never a speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOBS = 3000
SHARDQ = Path(sys.executable).parent / "shardq"  # the venv's entry point of this checkout


def test_head_budget_bench_measures_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "head.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.head_budget", "--jobs", str(JOBS), "--batch", "500",
         "--head-jobs", "100", "--shardq", f"other={SHARDQ}", "--settle", "0",
         "--sample-every", "0.1", "--trace-every", "1", "--dir", str(tmp_path),
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = {row["label"]: row for row in result["rows"]}
    assert list(rows) == ["other", "head_jobs=100"]  # other builds first
    assert rows["other"]["command"] == [str(SHARDQ)] and rows["other"]["head_jobs"] is None
    for row in rows.values():
        assert "error" not in row
        assert row["drained"] == JOBS and row["first_ping_s"] > 0
        assert row["stop_exit"] == 0 and row["final_exit"] == 0
        for phase in ("rss_after_push", "rss_after_restart", "rss_after_drain", "rss_settled",
                      "peak_first_run", "peak_second_run"):  # fmt: skip
            assert {"writer", "shard0", "shard1", "frontend"} <= set(row[phase])
        for moment in ("push", "restart", "drain", "settled", "stop"):
            assert row[f"db_mb_after_{moment}" if moment != "settled" else "db_mb_settled"] > 0
        sampled = row["sampled_peaks"]
        assert {"push", "restart", "drain"} <= set(sampled)
        assert sampled["push"]["shard0"] > 0 and row["trace"]
    assert "| head_jobs=100 | 3,000 |" in done.stdout  # the table row of the budgeted run
    assert "| other | 3,000 |" in done.stdout
