"""`shardq soak` end to end: a short run passes and writes its report and plot; a run whose
ledger claims what the server never acknowledged fails, naming the job."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from soak._config import SoakConfig, load_soak_config
from soak._ledger import Ledger
from soak._progress import Sample
from soak._report import check_rss

ROOT = Path(__file__).resolve().parents[2]
LOAD_S = "6"  # short: the checks, not the duration, are under test here
# The tampered ledger's phantoms fail the run whatever the load did: 2 s of it are enough.
TAMPERED_LOAD_S = "2"
RUN_TIMEOUT_S = 240


def run_soak(out: Path, *extra: str, seconds: str = LOAD_S) -> tuple[int, dict[str, Any], str]:
    cmd = [
        sys.executable, "-m", "shardq_cli.main", "soak", "--seconds", seconds, "--out", str(out),
        "--rate", "150", *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT)
    report = json.loads((out / "report.json").read_text())
    return done.returncode, report, done.stdout + done.stderr


def test_smoke_run_exits_0_and_writes_report_and_plot(tmp_path: Path) -> None:
    code, report, output = run_soak(tmp_path / "out")
    assert code == 0, output[-3000:]
    assert report["ok"] and report["violations"] == []
    ledger = report["ledger"]
    assert ledger["pushes_acknowledged"] > 100
    assert ledger["completions_acknowledged"] == ledger["pushes_acknowledged"]
    assert ledger["durable_lost"] == 0
    assert report["faults_injected"]["worker_churn"] >= 5  # every 400 ms over 6 s
    assert report["drain"]["drained"] and report["drain"]["baseline"]
    assert report["drain"]["stats"]["dlq"] == 0
    print(f"soak smoke: {ledger['pushes_acknowledged']} pushes, {ledger['deliveries']} "
          f"deliveries, {report['faults_injected']} faults")  # fmt: skip
    assert not report["rss"]["checked"] and "too short" in report["rss"]["reason"]
    png = (tmp_path / "out" / "soak.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    # Not a terminal: progress is JSON lines.
    lines = [json.loads(x) for x in output.splitlines() if x.startswith("{")]
    assert any(x["event"] == "soak progress" and "rss" in x for x in lines)


def test_tampered_ledger_fails_the_run(tmp_path: Path) -> None:
    """The ledger claims a durable and a buffered push the server never got: the run must fail
    and name both, since neither can ever complete."""
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    ledger.pushed("soak-0", ["phantom-durable"], durable=True)
    ledger.pushed("soak-1", ["phantom-buffered"], durable=False, t=time.time() - 3600)
    ledger.close()
    code, report, output = run_soak(
        tmp_path / "out", "--ledger", str(path), "--no-churn", seconds=TAMPERED_LOAD_S
    )
    assert code == 1, output[-3000:]
    assert not report["ok"]
    assert report["ledger"]["durable_lost_ids"] == ["phantom-durable"]
    assert report["ledger"]["buffered_lost_ids"] == ["phantom-buffered"]
    assert any("durable" in v for v in report["violations"])


def _samples(rss: list[int], step_s: float) -> list[Sample]:
    return [
        Sample(i * step_s, 0, 0, 0.0, 0, 0, 0, None, None, {"shard-0": v})
        for i, v in enumerate(rss)
    ]


def test_rss_plateau_check() -> None:
    cfg = SoakConfig(rss_min_fifth_s=5.0)
    flat = check_rss(_samples([100] * 20 + [105] * 30, 1.0), cfg)
    assert flat["checked"] and flat["ok"]
    growing = check_rss(_samples(list(range(100, 150)), 1.0), cfg)
    assert growing["checked"] and not growing["ok"] and growing["growth"] > 0.10
    short = check_rss(_samples([100] * 10, 1.0), cfg)
    assert not short["checked"] and "too short" in short["reason"]


def test_default_profile_loads() -> None:
    cfg = load_soak_config(ROOT / "configs" / "soak.toml")
    assert cfg.faults.churn_interval_ms == 400
    assert cfg.load.rate > 0 and cfg.shards >= 1


def test_only_a_kill_excuses_a_loss_or_a_rerun(tmp_path: Path) -> None:
    """The ledger checks on a hand-written ledger: a buffered loss or a rerun just before a
    kill is excused and counted; the same next to a SIGTERM restart, or far from any fault,
    breaks the run; a durable loss is never excused."""
    from soak._report import check_ledger

    ledger = Ledger(tmp_path / "ledger.sqlite3")
    t0 = 1_000_000.0
    ledger.fault("kill_server", t0, t0 + 3)
    ledger.fault("rolling_restart", t0 + 100, t0 + 105)
    ledger.pushed("q", ["near-kill"], durable=False, t=t0 - 0.5)
    ledger.pushed("q", ["near-restart"], durable=False, t=t0 + 99.5)
    ledger.pushed("q", ["durable-near-kill"], durable=True, t=t0 - 0.5)
    for job_id, acked in (("rerun-kill", t0 - 0.1), ("rerun-restart", t0 + 100.1)):
        ledger.pushed("q", [job_id], durable=False, t=acked - 1)
        ledger.ran([job_id], t=acked - 0.5)
        ledger.acked([job_id], t=acked)
        ledger.ran([job_id], t=acked + 9)  # delivered again after its acknowledged completion
    checked = check_ledger(ledger, SoakConfig(loss_window_s=2.0))
    ledger.close()
    assert checked["durable_lost_ids"] == ["durable-near-kill"]
    assert checked["buffered_lost_in_fault_window"] == 1
    assert checked["buffered_lost_ids"] == ["near-restart"]
    assert checked["reruns_after_completion_in_fault_window"] == 1
    assert checked["rerun_ids"] == ["rerun-restart"]


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        found += [int(child), *_descendants(int(child))]
    return found


def test_sigterm_stops_the_server_it_started(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "shardq_cli.main", "soak", "--seconds", "120",
        "--out", str(tmp_path), "--rate", "50",
    ]  # fmt: skip
    soak = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert soak.stdout is not None
        for _ in range(600):  # the first progress line: the server is up and under load
            if b"soak progress" in soak.stdout.readline():
                break
        server_tree = _descendants(soak.pid)
        assert server_tree, "the soak started no server"
        soak.terminate()
        soak.wait(timeout=90)
        deadline = time.monotonic() + 30
        while (alive := [p for p in server_tree if Path(f"/proc/{p}").exists()]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert alive == [], f"server processes left running: {alive}"
    finally:
        if soak.poll() is None:
            soak.kill()
            soak.wait()
