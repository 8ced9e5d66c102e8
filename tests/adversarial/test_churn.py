"""Sustained churn: the soak harness in a short form, in process.

Under push, pull and ack traffic (single, bulk, durable, delayed, prioritised, some failing
once), a worker's connection is dropped while it holds leases every 400 ms and a new one takes
its place. Every acknowledged push must complete, no job may run again after an acknowledged
completion, the queues must drain, and afterwards the server-wide live work and DLQ must be
back to zero. `SHARDQ_ADVERSARIAL_CHURN_S` runs longer (default 6 s of load).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from soak import SoakConfig, run_soak
from soak._config import FaultConfig, LoadConfig

LOAD_S = float(os.environ.get("SHARDQ_ADVERSARIAL_CHURN_S", "6"))


def test_worker_churn_every_400ms_loses_nothing(tmp_path: Path) -> None:
    cfg = SoakConfig(
        seconds=LOAD_S, seed=14, out_dir=tmp_path / "out", progress_interval_s=0.5,
        load=LoadConfig(rate=150.0, workers=4, queues=4),
        faults=FaultConfig(worker_churn=True, churn_interval_ms=400),
    )  # fmt: skip
    assert run_soak(cfg) == 0, (tmp_path / "out" / "report.json").read_text()[:3000]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    ledger = report["ledger"]
    assert report["worker_connections_dropped"] >= LOAD_S / 0.4 * 0.6  # the churn really ran
    assert ledger["completions_acknowledged"] == ledger["pushes_acknowledged"] > 0
    assert ledger["reruns_after_completion_in_fault_window"] == 0  # churn excuses nothing
    assert report["drain"]["baseline"] and report["drain"]["stats"]["active"] == 0
    print(f"churn: {report['worker_connections_dropped']} connections dropped, "
          f"{ledger['pushes_acknowledged']} jobs, {ledger['deliveries']} deliveries")  # fmt: skip
