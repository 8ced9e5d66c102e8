"""Smoke test of `python -m bench.delay_hops`: it runs and reports the client and the server's
busy processes. It asserts the shape of the report, never a speed or a count (the client's
system calls per push are checked in tests/client/test_sync_hops.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_delay_hops_reports_the_client_and_the_shard() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.delay_hops", "--calls", "50"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    number = r"[\d.]+"
    assert re.search(rf"\| client \([\d,]+ calls/s\) \| {number} \| {number} \| {number} \|",
                     done.stdout), done.stdout  # fmt: skip
    assert re.search(rf"\| shard \| {number} \| {number} \| {number} \|", done.stdout), done.stdout


# A client that runs on once its stdin closes, as the bench's does when it gets no "go".
_RUNS_ON = "import sys, time; print('ready', flush=True); sys.stdin.readline(); time.sleep(60)"


def _child(code: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return child


def test_the_client_and_strace_are_killed_when_the_measurement_fails() -> None:
    """A child left running holds the bench's stdout and stderr: the smoke test above would
    wait out its 120 s instead of failing at once."""
    from bench.delay_hops import _children

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the server"), _children(grace=30) as children:
        children += [_child(_RUNS_ON), _child(_RUNS_ON)]  # the client, then strace
        raise RuntimeError("the server went away")
    assert [child.poll() for child in children] == [-9, -9]
    assert time.monotonic() - started < 20  # killed, not given their grace


def test_a_child_that_does_not_exit_after_the_measurement_is_killed() -> None:
    from bench.delay_hops import _children

    with pytest.raises(RuntimeError, match="killed after 1 s"), _children(grace=1) as children:
        children.append(_child(_RUNS_ON))
    assert children[0].poll() == -9
