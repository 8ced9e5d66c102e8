"""Smoke test of `python -m bench.spin_cost`: real servers, spinning off and `auto` alternated,
a row per scenario and setting with every process and the spin counts of its stop lines.

It asserts the shape of the output and the counts that do not depend on the machine's load
(no spin at all with spinning off), never a speed.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_spin_cost_reports_every_process_and_the_spins(tmp_path: Path) -> None:
    out = tmp_path / "spin_cost.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.spin_cost", "--rounds", "1", "--jobs", "1000",
         "--scenarios", "pipe,single", "--configs", "0,auto", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| pipe", "| single"))]
    assert [row.split("|")[1:3] for row in rows] == [
        [" pipe ", " 0 "],
        [" pipe ", " auto "],
        [" single ", " 0 "],
        [" single ", " auto "],
    ]
    results = json.loads(out.read_text())
    for result in results:
        assert {"sup", "writer", "shard0", "frontend", "client"} <= set(result["us"])
        # every spinning role logged its stop line with its count
        assert set(result["spins"]) == {"front end", "shard", "writer"}, result["spins"]
        if result["spin_us"] == "0":
            assert sum(result["spins"].values()) == 0
    assert ast.literal_eval(rows[0].rsplit("|", 2)[1].strip()) == results[0]["spins"]
