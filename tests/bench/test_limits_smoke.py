"""Smoke test of `python -m bench.limits`: every building block is measured and tabulated.

Tiny runs; it asserts the shape of the output, never a speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_limits_measures_every_building_block(tmp_path: Path) -> None:
    out = tmp_path / "limits.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.limits", "--seconds", "0.1", "--repeats", "1",
         "--dir", str(tmp_path), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 6
    assert all(r["median"] > 0 and r["min"] <= r["median"] <= r["max"] for r in rows)
    table_rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert len(table_rows) == 1 + len(rows)  # the header and one line per row
    assert list(tmp_path.rglob("*.db*")) == []  # the SQLite files are cleaned up
    assert "disk of" in done.stdout


def test_limits_rejects_bad_arguments() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.limits", "--seconds", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--seconds must be positive" in done.stderr
