"""Smoke tests of the shard's CPU benchmarks: `python -m bench.shard_turns` (the shard's turns
in one process, whole or by step) and `python -m bench.writer_prof --role shard0 --profile`
(cProfile in a real server's shard, switched on and off by SIGUSR1 and SIGUSR2, which must not
stop the shard).

Small N; they assert the shape of the report, never a speed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_shard_turns_reports_every_scenario() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.shard_turns", "--jobs", "400", "--repeats", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    for scenario in ("ppa1q", "push1q", "drain1q", "worker1q", "pushb1q"):
        match = re.search(
            rf"^{scenario}: best ([0-9.]+) median ([0-9.]+) µs/job", done.stdout, re.M
        )
        assert match is not None, done.stdout
        assert 0 < float(match.group(1)) <= float(match.group(2))


def test_shard_turns_profiles() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.shard_turns", "--jobs", "400", "--scenario", "drain1q",
         "--profile", "--top", "5"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    calls = re.search(r"^drain1q: Python calls per job ([0-9.]+)", done.stdout, re.M)
    assert calls is not None and 10 < float(calls.group(1)) < 1000, done.stdout
    assert "| handle (_core.py:" in done.stdout  # the shard's own turn, by callees


def test_shard_turns_splits_a_drain_by_turn_and_step() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.shard_turns", "--jobs", "400", "--scenario", "drain1q",
         "--steps", "--repeats", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    steps = dict(
        ((turn, step), float(us))
        for turn, step, us in re.findall(r"^\| (\w+) \| (\w+) \| ([0-9.]+) \|$", done.stdout, re.M)
    )
    for turn in ("PULLB", "ACKB"):
        for step in ("handle", "finish_turn", "send"):
            assert (turn, step) in steps, done.stdout
    assert steps[("PULLB", "send")] > 0 and steps[("all", "all")] > steps[("PULLB", "send")]
    assert ("PUSHB", "handle") not in steps  # the fill is not measured


def test_a_real_shard_is_profiled_between_the_signals() -> None:
    shardq = str(Path(sys.executable).parent / "shardq")
    done = subprocess.run(
        [sys.executable, "-m", "bench.writer_prof", "--role", "shard0", "--scenario", "push1q",
         "--jobs", "500", "--profile", "--top", "5", "--executable", shardq],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert re.search(r"^push1q: 500 jobs, shard0 [0-9.]+ µs/job \(profiled\)", done.stdout, re.M)
    calls = re.search(r"^shard0 Python calls per job: ([0-9.]+)", done.stdout, re.M)
    assert calls is not None and float(calls.group(1)) > 5, done.stdout


def test_shard_turns_runs_with_cold_caches() -> None:
    """`--cold` writes over memory before every turn: the turns still run and are timed."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.shard_turns", "--jobs", "400", "--scenario", "drain1q",
         "--repeats", "1", "--cold", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    line = re.search(r"^drain1q: best [0-9.]+ median [0-9.]+ µs/job", done.stdout, re.M)
    assert line is not None, done.stdout
