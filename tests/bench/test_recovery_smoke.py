"""Smoke test of `python -m bench.recovery` at a tiny size: both layouts run end to end.

It asserts the shape of the results (every phase measured, every job drained), never a speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from shardq.runtime._routing import shard_of

REPO = Path(__file__).resolve().parents[2]
JOBS = 2000


def test_recovery_bench_measures_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "recovery.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.recovery", "--jobs", str(JOBS), "--batch", "200",
         "--settle", "0", "--shards", "2", "--dir", str(tmp_path), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["shards"] == 2
    rows = {row["layout"]: row for row in result["rows"]}
    assert sorted(rows) == ["one", "spread"]
    for row in rows.values():
        assert "error" not in row
        assert row["drained"] == JOBS
        assert row["ready_s"] > 0 and row["stop_exit"] == 0 and row["final_exit"] == 0
        for phase in ("rss_after_push", "rss_after_restart", "rss_after_drain", "rss_settled"):
            rss = row[phase]
            assert {"supervisor", "writer", "shard0", "shard1", "frontend"} <= set(rss)
            assert rss["total"] > 0
        assert row["db_mb_after_push"] > 0 and row["db_mb_after_drain"] > 0
        assert 0 < row["db_live_mb_after_stop"] <= row["db_mb_after_stop"]
    # `one` put its 4 queues on one shard; `spread` used both.
    assert len(set(rows["one"]["queues"])) == 4
    assert {shard_of(q, 2) for q in rows["one"]["queues"]} == {0}
    assert {shard_of(q, 2) for q in rows["spread"]["queues"]} == {0, 1}
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows)
    assert list(tmp_path.glob("shardq-recovery-*")) == []  # the data directories are removed
