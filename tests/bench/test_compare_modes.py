"""The report's "Durability modes" lines say each mode's label once: `- standin (not a queue):
a measuring device ...`, not `- standin (not a queue): not a queue: a measuring device ...`.
Rows made up here, with the modes `bench.compare._bq` gives them; the row keeps its full mode."""

from __future__ import annotations

import time

from bench.compare._bq import MODES
from bench.compare._cli import Run, build_report
from bench.compare._model import Row, Settings
from bench.compare._report import markdown, ratios


def _row(peer: str, mode: str) -> Row:
    return Row("push_single", 1, "push", 1, peer, "bunqueue-client", mode, "jobs/s", 100,
               [1.0], 1.0, 1.0, 1.0, {})  # fmt: skip


def test_each_mode_label_is_said_once() -> None:
    rows = [_row(peer, mode) for (peer, _), mode in MODES.items()]
    run = Run(Settings(), machine={"cpu_model": "m", "cpu_count": 2, "memory_gib": 1, "os": "o",
              "python": "p", "load_average_at_start": [0, 0, 0]})  # fmt: skip
    report = build_report(run, rows, "c", time.monotonic())
    assert report["modes"]["standin (not a queue)"].startswith("a measuring device"), report
    assert report["modes"]["shardq (durable)"].startswith("reply after its commit"), report
    assert [r.mode for r in rows] == list(MODES.values())  # the rows keep their own
    text = markdown(report, rows, ratios(rows))
    assert "- standin (not a queue): a measuring device (python -m bench.bq_ceiling" in text
    assert "not a queue: not a queue" not in text and "(not a queue): not a queue" not in text
    for (peer, _), mode in MODES.items():
        label, _, what = mode.partition(": ")
        assert f"- {peer} ({label}): {what}" in text
