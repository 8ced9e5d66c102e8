"""Smoke test of `python -m bench.delay`: it runs and reports every row. It asserts the shape of
the report, never a speed (the call counts are checked in tests/tasks/test_delay_cost.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_delay_bench_reports_both_clients_on_every_path() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.delay", "--calls", "20", "--rounds", "1", "--profile"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert re.search(r"`\.delay\(\)` [\d.]+ µs, `Queue\.add` [\d.]+ µs", done.stdout)
    for scheme in ("tcp", "zmq"):
        for mode in ("buffered", "durable"):
            for client in ("`.delay()`", "`Queue.add`"):
                row = re.search(
                    rf"\| {scheme} {mode} {re.escape(client)} \| ([\d,]+) \|", done.stdout
                )
                assert row is not None and int(row.group(1).replace(",", "")) > 0, done.stdout
        assert re.search(rf"\| {scheme} \| [\d.]+ \| [\d.]+ \| -?[\d.]+ \|", done.stdout)
