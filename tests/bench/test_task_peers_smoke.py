"""Smoke test of issue 15's task-API scenarios in `python -m bench compare`: shardq (`shardq.App`,
`shardq worker --processes 2`) and taskiq (its own API and `taskiq worker --workers 2`, on a
private Redis) with tiny counts, one repeat, one shardq server for the run (`--quick`).

It asserts the shape of the report, never a speed: every scenario has a row per contestant, the
drains finished every job with 2 worker processes, a peer without a bulk call says so instead
of a number, and the shardq/peer ratios are there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from bench.compare._env import PEER_REQUIREMENTS

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ("tasks_push_single", "tasks_push_bulk_100", "tasks_drain_2p")
JOBS = 100
# A drain ends as soon as its JOBS are done; this only bounds how long one is waited for
# after its first completion (`bench.compare._drain`): not a speed, so generous for a loaded
# 2-core machine. The run's own bound covers both peers' starts, the scenarios and windows.
DRAIN_WINDOW_S = 60
RUN_TIMEOUT_S = 480


def _run(out_dir: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--quick", "--peers", "shardq,taskiq",
         "--scenarios", ",".join(SCENARIOS), "--jobs", str(JOBS), "--repeats", "1",
         "--drain-window", str(DRAIN_WINDOW_S), "--out-dir", str(out_dir), "--label", "tasks"],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (json_file,) = out_dir.glob("*-tasks.json")
    report: dict[str, object] = json.loads(json_file.read_text())
    return report


def _row(rows: list[dict[str, object]], scenario: str, peer: str) -> dict[str, object]:
    (row,) = [r for r in rows if r["scenario"] == scenario and r["peer"] == peer]
    return row


def test_task_scenarios_run_shardq_and_taskiq(tmp_path: Path) -> None:
    report = _run(tmp_path)
    rows = report["rows"]
    assert isinstance(rows, list)
    assert {r["peer"] for r in rows} == {"shardq", "taskiq"}  # shardq.App only, no SDK rows
    assert {r["scenario"] for r in rows} == set(SCENARIOS)

    for scenario in SCENARIOS:
        mine = _row(rows, scenario, "shardq")
        assert str(mine["client"]).startswith("shardq-tasks"), mine
        assert mine["median"] and mine["note"] == "", (mine, report["notes"])
    assert "--processes 2" in str(_row(rows, "tasks_drain_2p", "shardq")["client"])

    for scenario in ("tasks_push_single", "tasks_drain_2p"):
        theirs = _row(rows, scenario, "taskiq")
        assert theirs["median"] and theirs["note"] == "", (theirs, report["notes"])
        assert theirs["mode"].startswith("everysec"), theirs  # type: ignore[union-attr]
    for peer in ("shardq", "taskiq"):
        drained = _row(rows, "tasks_drain_2p", peer)["extra"]
        assert drained["completed"]["min"] == JOBS, drained  # type: ignore[index]

    no_bulk = _row(rows, "tasks_push_bulk_100", "taskiq")
    assert no_bulk["median"] is None and "no bulk API" in str(no_bulk["note"])

    ratios = report["ratios"]
    assert isinstance(ratios, list)
    against = {(r["scenario"], r["against"]) for r in ratios}
    assert ("tasks_push_single", "taskiq") in against
    assert ("tasks_drain_2p", "taskiq") in against
    (goal,) = [r for r in ratios if r["scenario"] == "tasks_drain_2p"
               and r["against"] == "fastest Python peer"]  # fmt: skip
    assert goal["target"] == 5.0 and goal["other_peer"] == "taskiq"


def test_the_bench_extra_pins_what_the_harness_installs() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["bench"]
    assert tuple(extra) == PEER_REQUIREMENTS
