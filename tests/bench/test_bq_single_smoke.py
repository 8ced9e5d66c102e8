"""Smoke test of `python -m bench.bq_single` against shardq alone: every client's row is
reported, bunqueue-client's call is split at its reader thread, and the reply's bytes are
shown. Small N; it asserts the shape of the report and that the split adds up, never a speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bq_single_splits_each_call(tmp_path: Path) -> None:
    out = tmp_path / "bq_single.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.bq_single", "--requests", "60", "--rounds", "1",
         "--spin", "0", "--no-bunqueue", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "reply to one PUSH from shardq spin=0: 58 bytes, keys id, ok, reqId" in done.stdout
    medians = {row["client"]: row for row in json.loads(out.read_text())["medians"]}
    assert set(medians) == {"bqc", "raw", "sdk"}, medians
    split = medians["bqc"]["stats"]
    assert set(split) == {"bqc", "sent->arrived", "arrived->returned"}, split
    # The reader thread saw every reply before the caller returned: both parts are positive
    # and neither exceeds the whole call.
    for part in ("sent->arrived", "arrived->returned"):
        assert 0 < split[part]["p50"] <= split["bqc"]["p99"], split
    for row in medians.values():
        assert row["server wake-ups"] >= 0 and row["server CPU µs"] >= 0, row
        # shardq timed every push its shard answered: the window's share is read from Metrics.
        assert 0 < row["shard µs"] <= row["stats"][row["client"]]["p99"], row
