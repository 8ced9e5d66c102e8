"""Smoke test of `python -m bench.writer`: it runs both scenarios and writes its JSON.

Small N and one repeat; it asserts the shape of the report, never a speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_writer_bench_reports_both_scenarios(tmp_path: Path) -> None:
    out = tmp_path / "writer.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.writer", "--jobs", "300", "--repeats", "1",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(out.read_text())
    assert [row["scenario"] for row in rows] == [
        "PUSHB of 100",
        "push->pull->ack (PUSHB, PULLB 100, ACKB)",
    ]
    for row in rows:
        assert row["writer_us_per_job"] > 0 and row["shard_encode_us_per_job"] > 0
        assert row["frame_bytes_per_job"] > 100  # a record per job went through
        assert f"| {row['scenario']} |" in done.stdout
