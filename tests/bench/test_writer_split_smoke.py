"""Smoke test of `python -m bench.writer_split`: the writer's statements recorded from ppa1q's
shape, replayed with their time per kind, with an index dropped, and both runs for valgrind.

Small N; it asserts the shape of the report, never a speed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "bench.writer_split", *args],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_the_split_records_times_drops_and_replays(tmp_path: Path) -> None:
    out = str(tmp_path / "ppa.pkl")
    recorded = _run("record", out, "--jobs", "2000")
    match = re.search(
        r"^2000 jobs, (\d+) statements; writer CPU µs/job: whole ([0-9.]+), statements"
        r" ([0-9.]+), Python (-?[0-9.]+)$",
        recorded, re.M,
    )  # fmt: skip
    assert match is not None, recorded
    assert int(match.group(1)) > 10 and float(match.group(3)) > 0
    timed = _run("time", out, "--repeats", "1", "--drop", "idx_jobs_queue")
    assert re.search(r"^drop \['idx_jobs_queue'\]: statements [0-9.]+ µs/job", timed, re.M)
    assert re.search(r"^\| INSERT jobs \(put rows\) \| \d+ \| [0-9.]+ \|$", timed, re.M), timed
    assert re.search(r"^\| COMMIT \| \d+ \| [0-9.]+ \|$", timed, re.M), timed
    assert _run("replay", out, "--times", "1") == ""
    assert _run("write", out, "--times", "1") == ""
