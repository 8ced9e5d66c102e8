"""The pytest plugin as a user's test suite sees it: a test file of its own, run by pytest
in a subprocess, using the `shardq_server`, `shardq_app` and `shardq_worker` fixtures and
eager mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

USER_TESTS = """
import shardq


def test_round_trip_on_a_real_server(shardq_server, shardq_app, shardq_worker):
    assert shardq_server.url.startswith("tcp://127.0.0.1:")

    @shardq_app.task(queue="user-q")
    def shout(text):
        return text.upper()

    @shardq_app.task(queue="user-q", attempts=1)
    async def fail():
        raise RuntimeError("nope")

    shardq_worker(shardq_app)
    assert shout.delay("hi").get(timeout=10) == "HI"
    try:
        fail.delay().get(timeout=10)
    except shardq.TaskFailed as e:
        assert e.exc_type == "RuntimeError" and "nope" in e.reason
    else:
        raise AssertionError("fail() did not fail")


def test_same_server_for_the_session(shardq_server, shardq_app):
    assert shardq_app.url == shardq_server.url
    assert shardq_app.queue("user-q").counts().completed == 1


def test_periodic_tasks_run_under_the_test_worker(shardq_app, shardq_worker):
    import time

    ticks = []

    @shardq_app.periodic(every=0.2)
    @shardq_app.task(queue="tick-q")
    def tick():
        ticks.append(time.monotonic())

    shardq_worker(shardq_app)
    deadline = time.monotonic() + 10
    while len(ticks) < 3:
        assert time.monotonic() < deadline, ticks
        time.sleep(0.02)
    shardq_app.queue("tick-q").connection.call({"cmd": "CronDelete", "name": tick.name})


def test_eager_mode_needs_no_server():
    app = shardq.App(eager=True)

    @app.task
    def add(a, b):
        return a + b

    assert add.delay(2, 3).get() == 5
"""


def test_plugin_fixtures_in_a_users_test_file(tmp_path: Path) -> None:
    # A pytest of its own, outside this repository (no conftest, no ini): the fixtures can
    # only come from the installed plugin's entry point.
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 passed" in run.stdout, run.stdout
