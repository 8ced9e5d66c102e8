"""Smoke test of `python -m bench.bq_ceiling`: bunqueue-client's Worker drains the stand-in
server and the harness reports each repeat. Small N; it asserts the shape of the report (and
that every job was drained), never a speed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_bq_ceiling_reports_each_repeat() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bq_ceiling", "--jobs", "1000", "--repeats", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = re.findall(
        r"^repeat \d: ([0-9,]+) jobs/s, worker ([0-9.]+|nan) µs/job, stand-in ([0-9.]+|nan) µs/job",
        done.stdout,
        re.M,
    )
    assert len(rows) == 2, done.stdout
    for rate, worker, _server in rows:
        # The CPU figures are nan when the worker was done before the first look.
        assert float(rate.replace(",", "")) > 0 and not float(worker) <= 0
    assert re.search(r"^median [0-9,]+ jobs/s$", done.stdout, re.M), done.stdout


# A child that ignores SIGTERM, as the bunqueue worker is while it connects.
_DEAF = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True);"
    " time.sleep(60)"
)


def test_every_child_is_stopped_when_a_repeat_fails() -> None:
    """A child that ignores SIGTERM is killed, and the others are still stopped: one left
    running holds the bench's stdout and stderr, and the smoke test above would wait out its
    180 s instead of failing at once."""
    from bench.bq_ceiling import _children

    started = time.monotonic()
    with pytest.raises(RuntimeError), _children(grace=1.0) as children:
        for _ in range(2):  # the worker (deaf while it connects), then the stand-in
            deaf = subprocess.Popen([sys.executable, "-c", _DEAF], stdout=subprocess.PIPE)
            children.append(deaf)
            assert deaf.stdout is not None and deaf.stdout.readline() == b"1\n"
        children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        raise RuntimeError("the worker completed nothing")
    assert [child.poll() for child in children] == [-9, -9, -15]
    assert time.monotonic() - started < 30  # killed after its grace, not waited out
    for child in children:
        if child.stdout is not None:
            child.stdout.close()
