"""Periodic tasks: `shardq worker` writes one server schedule per task when it starts (no
beat process), the server fires them (cron with seconds, and `every`), a second worker
starting rewrites the same schedules without firing any slot twice."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import periodic_tasks
import pytest
from shardq_harness import ShardqServer
from task_helpers import WorkerProcess

from shardq.client import Connection
from shardq.tasks import App

NAMES = (periodic_tasks.every_second.name, periodic_tasks.each_cron_second.name)


@pytest.fixture
def schedules(url: str) -> Iterator[Connection]:
    with Connection(url) as conn:
        yield conn
        for name in NAMES:  # the server would go on firing them for the other tests
            conn.call_many([{"cmd": "CronDelete", "name": name}], check=False)


def _runs(log: Path, tag: str) -> list[tuple[int, float]]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [(int(float(s)), float(t)) for what, s, t in (line.split() for line in lines)
            if what == tag]  # fmt: skip


def _wait_runs(log: Path, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while min(len(_runs(log, "every")), len(_runs(log, "cron"))) < count:
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no runs"
        time.sleep(0.05)


def _start(url: str, log: Path, name: str) -> WorkerProcess:
    worker = WorkerProcess(url, log.parent / name, app="periodic_tasks:app",
                           env={"SHARDQ_TEST_PERIODIC_LOG": str(log)})  # fmt: skip
    worker.wait_log("worker starting")
    return worker


def test_the_worker_writes_the_schedules_and_the_server_fires_them(
    url: str, tmp_path: Path, schedules: Connection
) -> None:
    log = tmp_path / "runs.log"
    first = _start(url, log, "first.log")
    try:
        written = first.wait_log("schedules written")[0]
        assert sorted(written["tasks"]) == sorted(NAMES)
        crons = {c["name"]: c for c in schedules.call({"cmd": "CronList"})["crons"]}
        every, cron = crons[NAMES[0]], crons[NAMES[1]]
        assert (every["queue"], every["jobName"], every["repeatEvery"]) == (
            "periodic", NAMES[0], 1000)  # fmt: skip
        assert (cron["schedule"], cron["timezone"], cron["jobName"]) == (
            "* * * * * *", "Europe/Paris", NAMES[1])  # fmt: skip
        _wait_runs(log, 2)
        # A second worker starting rewrites both schedules (one per task, still).
        second = _start(url, log, "second.log")
        try:
            second.wait_log("schedules written")
            before = {t: len(_runs(log, t)) for t in ("every", "cron")}
            _wait_runs(log, max(before.values()) + 2)
        finally:
            assert second.stop() == 0, second.tail()
    finally:
        assert first.stop() == 0, first.tail()
    names = [c["name"] for c in schedules.call({"cmd": "CronList"})["crons"]]
    assert sorted(n for n in names if n in NAMES) == sorted(NAMES)
    for tag in ("every", "cron"):
        slots = [slot for slot, _ in _runs(log, tag)]
        assert len(set(slots)) == len(slots), f"a {tag} slot fired twice: {sorted(slots)}"
    cron_slots = sorted(slot for slot, _ in _runs(log, "cron"))
    assert all(slot % 1000 == 0 for slot in cron_slots), cron_slots  # whole seconds
    every_slots = sorted(slot for slot, _ in _runs(log, "every"))
    gaps = [b - a for a, b in itertools.pairwise(every_slots)]
    assert all(gap >= 800 for gap in gaps), gaps  # never closer than 0.8 intervals


def test_a_worker_started_before_its_server_writes_the_schedules_later(tmp_path: Path) -> None:
    srv = ShardqServer(tmp_path / "data")  # ports chosen, not started yet
    url = f"tcp://{srv.host}:{srv.tcp_port}"
    log = tmp_path / "runs.log"
    env = {"SHARDQ_TEST_PERIODIC_LOG": str(log)}
    worker = WorkerProcess(url, tmp_path / "worker.log", "--processes", "2",
                           app="periodic_tasks:app", env=env)  # fmt: skip
    try:
        worker.wait_log("cannot write the periodic tasks' schedules yet; retrying")
        with srv.start():
            worker.wait_log("schedules written")
            _wait_runs(log, 1)
            assert worker.stop() == 0, worker.tail()
            assert srv.stop() == 0, srv.log_tail()
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()


def test_periodic_refusals() -> None:
    app = App()

    @app.task
    def job() -> None: ...

    for kwargs, message in [
        ({}, "not both"),
        ({"cron": "* * *", "every": None}, "invalid cron expression"),
        ({"cron": "*/5 * * * *", "every": 30}, "not both"),
        ({"every": 0}, "every must be"),
        ({"every": 30, "tz": "Europe/Paris"}, "tz applies"),
        ({"cron": "0 * * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
    ]:
        args: dict[str, Any] = dict(kwargs)
        cron = args.pop("cron", None)
        with pytest.raises(ValueError, match=message):
            app.periodic(cron, **args)
    app.periodic(every=30)(job)
    with pytest.raises(ValueError, match="already has a schedule"):
        app.periodic(every=60)(job)
    with pytest.raises(TypeError, match=r"goes above @app\.task"):
        app.periodic(every=30)(lambda: None)  # type: ignore[arg-type]
