"""`python -m bench compare --interleave`: the contestants of a scenario take turns, one repeat
each, and every ratio is also given round by round.

The run starts the real shardq server and the real bunqueue (installed by the harness) and
drives both with bunqueue-client; it checks the order of the rounds and the arithmetic of the
per-round ratios, never a speed.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

from bench.compare._model import Row
from bench.compare._report import ratios

REPO = Path(__file__).resolve().parents[2]


def _row(peer: str, samples: list[float], rounds: list[int] | None) -> Row:
    return Row("push_single", 1, "single push", 1, peer, "bunqueue-client", "buffered", "jobs/s",
               10, samples, statistics.median(samples), min(samples), max(samples), {},
               rounds=rounds)  # fmt: skip


def test_rounds_alternate_and_each_round_has_its_ratio(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--interleave", "--peers", "shardq,bunqueue",
         "--scenarios", "push_single", "--jobs", "30", "--repeats", "2", "--out-dir",
         str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    order = re.findall(r"running push_single / (\S+) / bunqueue-client \(round (\d) of 2\)",
                       done.stderr)  # fmt: skip
    assert order == [("shardq", "1"), ("bunqueue", "1"), ("shardq", "2"), ("bunqueue", "2")]

    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert report["settings"]["interleave"] is True
    rows = {(r["peer"], r["client"]): r for r in report["rows"]}
    mine, theirs = rows["shardq", "bunqueue-client"], rows["bunqueue", "bunqueue-client"]
    assert mine["rounds"] == [0, 1] and theirs["rounds"] == [0, 1]
    ratio = next(r for r in report["ratios"] if r["client"] == "bunqueue-client")
    expected = [a / b for a, b in zip(mine["samples"], theirs["samples"], strict=True)]
    assert ratio["per_round"] == expected
    table = next(tmp_path.glob("*.md")).read_text()
    assert "| per round | median per round |" in table


def test_a_round_one_side_missed_is_left_out_of_the_pairs() -> None:
    mine = _row("shardq", [100.0, 200.0, 300.0], [0, 1, 2])
    theirs = _row("bunqueue", [50.0, 150.0], [0, 2])  # its round 1 failed
    (ratio,) = ratios([mine, theirs])
    assert ratio.per_round == [2.0, 2.0]
    assert ratio.ratio == 200.0 / 100.0  # the medians' ratio, as without --interleave


def test_rows_without_rounds_have_no_per_round_ratio() -> None:
    (ratio,) = ratios([_row("shardq", [100.0], None), _row("bunqueue", [50.0], None)])
    assert ratio.per_round == []


def test_interleave_with_quick_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--quick", "--interleave"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "--interleave needs a fresh server for each round: drop --quick" in done.stderr
