"""`python -m bench compare --peers ...,standin`: bunqueue-client's own ceiling in the same run.

The run drives the stand-in alone (no server to start, a few seconds) and checks that its rows,
their client CPU per job and the ceiling section are reported; the ratio against shardq and the
section's arithmetic are checked on rows made up here. Never a speed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.compare._model import Row
from bench.compare._report import markdown, ratios

REPO = Path(__file__).resolve().parents[2]


def test_the_standin_drains_and_reports_client_cpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--quick", "--peers", "standin",
         "--scenarios", "push_single,drain_c50,latency_c10", "--jobs", "2000",
         "--out-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    rows = {r["scenario"]: r for r in report["rows"]}
    assert set(rows) == {"push_single", "drain_c50"}, rows  # no latency row: not a queue
    for row in rows.values():
        assert row["peer"] == "standin" and row["client"].startswith("bunqueue-client"), row
        assert row["mode"].startswith("not a queue: a measuring device"), row
        assert row["median"] and row["note"] != "failed", report["notes"]
        assert row["extra"]["client_cpu_us"]["median"] > 0, row
    assert row["extra"]["completed"]["min"] == 2000, row  # every pushed job was pulled once
    assert any("standin is a measuring device, not a queue" in n for n in report["notes"])
    table = next(tmp_path.glob("*.md")).read_text()
    assert "## The client's ceiling (stand-in)" in table
    assert "worker CPU" in table and "client CPU" in table


def _row(scenario: str, peer: str, client: str, samples: list[float]) -> Row:
    return Row(scenario, 5, scenario, 1, peer, client, "buffered", "jobs/s", 100, samples,
               statistics.median(samples), min(samples), max(samples),
               {"client_cpu_us": {"median": 120.0, "min": 110.0, "max": 130.0}})  # fmt: skip


def test_shardq_is_given_as_a_share_of_the_ceiling() -> None:
    worker = "bunqueue-client Worker (batch_size 10, ACK per job)"
    rows = [_row("drain_c50", "shardq", worker, [6000.0]),
            _row("drain_c50", "bunqueue", worker, [3000.0]),
            _row("drain_c50", "standin", worker, [8000.0])]  # fmt: skip
    items = ratios(rows)
    # The ratio against bunqueue is as without the stand-in; the stand-in's is for information.
    assert [(r.against, r.ratio, r.target) for r in items] == [
        ("bunqueue", 2.0, 1.5), ("stand-in (the client's ceiling)", 0.75, None)]  # fmt: skip
    report = {"date": "d", "command": "c", "machine": {"cpu_model": "m", "cpu_count": 2,
              "memory_gib": 1, "os": "o", "python": "p", "load_average_at_start": [0, 0, 0]},
              "versions": {}, "settings": {}, "modes": {}, "commands": {}, "notes": []}  # fmt: skip
    text = markdown(report, rows, items)
    assert (f"- drain_c50, {worker}: stand-in 8,000 jobs/s (client CPU 120 µs a job); shardq "
            "0.75 of the ceiling (client CPU 120 µs a job); bunqueue 0.38 of the ceiling (client "
            "CPU 120 µs a job); at most 2.67x bunqueue with this client") in text  # fmt: skip
