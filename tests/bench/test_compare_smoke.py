"""Smoke test of `python -m bench compare --quick`: the harness runs and writes its report.

It runs shardq only, with a small N and one repeat, and asserts the shape of what it writes,
never a speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TOP_KEYS = {"date", "command", "machine", "versions", "settings", "modes", "commands", "notes",
            "elapsed_s", "rows", "ratios"}  # fmt: skip
ROW_KEYS = {"scenario", "group", "title", "queues", "peer", "client", "mode", "unit", "jobs",
            "samples", "median", "min", "max", "extra", "note"}  # fmt: skip
# At least these scenarios must produce a number with the raw client and bunqueue-client.
MEASURED = {"push_single", "push_pipelined", "push_bulk_100", "push_bulk_1000", "durable_single",
            "durable_bulk_100", "drain_c1", "drain_c10", "drain_c50", "drain_raw", "latency_c10",
            "push_pipelined_8q", "drain_8q_c8", "drain_raw_8q"}  # fmt: skip


def test_compare_quick_writes_json_and_table(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--quick", "--out-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]

    json_files = list(tmp_path.glob("*.json"))
    md_files = list(tmp_path.glob("*.md"))
    assert len(json_files) == 1 and len(md_files) == 1
    assert json_files[0].stem == md_files[0].stem  # <date>-quick.json and <date>-quick.md

    report = json.loads(json_files[0].read_text())
    assert report.keys() >= TOP_KEYS
    assert report["settings"]["quick"] is True
    assert report["machine"]["cpu_count"] >= 1
    assert {row["peer"] for row in report["rows"]} <= {"shardq", "shardq-fsync"}
    for row in report["rows"]:
        assert row.keys() >= ROW_KEYS
        assert row["mode"], row
    measured = {row["scenario"] for row in report["rows"] if row["median"] is not None}
    assert measured >= MEASURED, report["notes"]
    failed = [row for row in report["rows"] if row["note"] == "failed"]
    assert not failed, [note for note in report["notes"] if " failed: " in note]

    table = md_files[0].read_text()
    assert (
        "| # | scenario | q | peer | client | mode | median | min | max | unit | notes |" in table
    )
    assert "## Ratios" in table and "## Commands" in table
    assert table.strip() in done.stdout  # the same table goes to stdout


def _may_go_realtime() -> bool:
    try:
        pid = os.fork()
    except OSError:
        return False
    if pid == 0:  # try in a child, so this process keeps its own scheduling
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            os._exit(1)
        os._exit(0)
    return os.waitpid(pid, 0)[1] == 0


def test_realtime_runs_every_process_under_sched_fifo(tmp_path: Path) -> None:
    if not _may_go_realtime():
        pytest.skip("this machine refuses SCHED_FIFO to this user (needs CAP_SYS_NICE)")
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--quick", "--realtime", "1",
         "--peers", "shardq", "--scenarios", "push_single", "--out-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert any("SCHED_FIFO at priority 1" in note for note in report["notes"])
    assert report["command"].endswith("--realtime 1 --peers shardq --scenarios push_single "
                                      f"--out-dir {tmp_path}")  # fmt: skip
    assert next(r["median"] for r in report["rows"] if r["scenario"] == "push_single")


def test_realtime_refused_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--quick", "--realtime", "100"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "--realtime 100: cannot switch to SCHED_FIFO" in done.stderr


def test_single_push_rows_carry_the_median_call(tmp_path: Path) -> None:
    # jobs/s is one over the mean call: the bunqueue-client single rows also give the median
    # call (issue 24), so a run can be read without its tail.
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--quick", "--peers", "shardq",
         "--scenarios", "push_single,durable_single", "--out-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    rows = [r for r in report["rows"] if r["client"] == "bunqueue-client"]
    assert {r["scenario"] for r in rows} == {"push_single", "durable_single"}, report["rows"]
    for row in rows:
        p50 = row["extra"]["p50_us"]["median"]
        # A positive time, within 1.5 times the slowest repeat's mean call.
        assert 0 < p50 <= 1e6 / row["min"] * 1.5, row
    assert "µs a call (median of repeats)" in next(tmp_path.glob("*.md")).read_text()
