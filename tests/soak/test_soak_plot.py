"""The soak's plot: a title, every fault of the run marked, and a clear line instead of a crash
when matplotlib (the `plot` extra) is not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from PIL import Image

from soak._progress import Sample
from soak._report import PLOT_MISSING, plot_faults, write_plot


def _samples(n: int) -> list[Sample]:
    return [
        Sample(elapsed_s=float(i), pushed=10 * i, completed=9 * i, jobs_per_s=100.0, pending=1,
               duplicates=0, errors=0, latency_p50_ms=1.0, latency_p99_ms=4.0,
               rss={"writer": 50 << 20})
        for i in range(n)
    ]  # fmt: skip


def test_the_plot_has_a_title_and_marks_each_fault_of_this_run(tmp_path: Path) -> None:
    started = 1_000_000.0
    ledger = [
        ("kill_shard", started - 50, started - 49),  # an earlier run on the same ledger
        ("kill_shard", started + 10, started + 10.4),
        ("kill_writer", started + 20, started + 21),
        ("worker_churn", started + 5, started + 5.01),
    ]
    faults = plot_faults(ledger, started)
    assert [f[0] for f in faults] == ["kill_shard", "kill_writer", "worker_churn"]
    path = tmp_path / "soak.png"
    assert write_plot(path, _samples(30), faults, "shardq soak: 30 s, seed 7, ok") is True
    text = Image.open(path).text  # type: ignore[attr-defined]
    assert text["Title"] == "shardq soak: 30 s, seed 7, ok"
    assert text["Description"] == (
        "faults: kill_shard 10.0-10.4 s; kill_writer 20.0-21.0 s; worker_churn 5.0-5.0 s"
    )


def test_without_matplotlib_the_soak_says_which_extra_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from pathlib import Path\n"
        "from soak._report import write_plot\n"
        f"assert write_plot(Path({str(tmp_path / 'x.png')!r}), []) is False\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == PLOT_MISSING
    assert not (tmp_path / "x.png").exists()
