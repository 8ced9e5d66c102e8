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


def test_head_budget_from_dir_runs_the_later_moments_on_a_saved_directory(tmp_path: Path) -> None:
    """A run that keeps its directory with jobs left (`--keep --drain-max`), then `--from-dir`
    on it: no push, the jobs waiting counted, progress lines during the drain, every later
    moment measured, the directory drained and left in place with its first logs."""
    saved = tmp_path / "saved"
    saved.mkdir()
    keep = subprocess.run(
        [sys.executable, "-m", "bench.head_budget", "--jobs", str(JOBS), "--batch", "500",
         "--head-jobs", "100", "--drain-max", "1000", "--keep", "--settle", "0",
         "--dir", str(saved)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert keep.returncode == 0, keep.stdout[-2000:] + keep.stderr[-4000:]
    (data,) = saved.iterdir()
    out = tmp_path / "from.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.head_budget", "--from-dir", str(data), "--batch", "100",
         "--head-jobs", "100", "--settle", "0", "--vacuum-wait", "10", "--sample-every", "0.1",
         "--progress-every", "0.01", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert "error" not in row and "push_jobs_per_s" not in row
    assert row["jobs"] == JOBS - 1000 and row["drained"] == JOBS - 1000
    assert row["first_start_s"] > 0 and row["first_ping_s"] > 0 and row["progress_notes"] > 0
    assert " left, " in done.stderr and "jobs waiting" in done.stderr
    for phase in ("rss_after_push", "rss_after_restart", "rss_after_drain", "rss_settled"):
        assert {"writer", "shard0", "shard1", "frontend"} <= set(row[phase])
    assert row["db_mb_after_drain"] > 0 and row["vacuum_s"] is not None
    assert row["stop_exit"] == 0 and row["final_exit"] == 0
    logs = sorted(p.name for p in data.glob("server-*.log"))
    assert logs == ["server-1.log", "server-2.log", "server-3.log", "server-4.log"]
    assert f"| head_jobs=100 | {JOBS - 1000:,} | - |" in done.stdout
