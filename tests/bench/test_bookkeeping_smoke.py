"""Smoke test of `python -m bench.bookkeeping`: both kinds are set up on a real server and
`Count` is measured. Tiny runs; it asserts the shape of the output, never a speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bookkeeping_measures_count_beside_crons_and_groups(tmp_path: Path) -> None:
    out = tmp_path / "bookkeeping.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.bookkeeping", "--counts", "0", "1200", "--rate", "100",
         "--seconds", "0.2", "--shards", "1", "--warmup", "0.2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["kind"], r["count"]) for r in rows] == [
        ("crons", 0), ("crons", 1200), ("groups", 0), ("groups", 1200)
    ]  # fmt: skip
    for row in rows:
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert row["samples"] == 20
        assert len(row["lots_s"]) == (2 if row["count"] else 0)  # a lot per 1,000 begun
    table_rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert len(table_rows) == 1 + len(rows)


def test_bookkeeping_rejects_bad_arguments() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bookkeeping", "--counts", "-1"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--counts must be 0 or more" in done.stderr
