"""`shardq worker` as a command: refusals of a bad app, and the live status line on a
terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sample_tasks
from shardq_harness import ShardqServer
from task_helpers import WorkerProcess

HERE = Path(__file__).resolve().parent


def _worker(*args: str, **popen: Any) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "shardq_cli.main", "worker", *args]
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    return subprocess.Popen(argv, cwd=HERE, stdin=subprocess.DEVNULL, env=env, **popen)


def test_an_app_that_cannot_be_loaded_exits_2() -> None:
    for spec, message in [
        ("no_such_module:app", b"cannot import 'no_such_module'"),
        ("sample_tasks:add", b"'sample_tasks:add' is not a shardq.App (got Task)"),
    ]:
        proc = _worker(spec, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 2 and message in err, err


def test_out_of_range_prefetch_exits_2() -> None:
    for args, message in [
        (["--prefetch", "-1"], b"--prefetch must be in 0..10000, got -1"),
        (["--prefetch", "100", "--prefetch-max", "50"],
         b"--prefetch-max must be in --prefetch (100)..10000, got 50"),
    ]:  # fmt: skip
        proc = _worker("sample_tasks:app", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 2 and message in err, err


def test_prefetch_flags_bound_the_jobs_a_worker_holds(
    start_worker: Callable[..., WorkerProcess], sample_app: Any, url: str, tmp_path: Path
) -> None:
    """`--prefetch 0 --prefetch-max 0`: a worker leases only what its 2 slots run (by default
    it would hold all 20 jobs at once)."""
    queue = sample_app.queue("batch")  # shared with other tests: left empty, as found
    queue.obliterate()
    log = tmp_path / "done.log"
    results = [sample_tasks.record.delay(str(log), f"job-{i}", 0.1) for i in range(20)]
    worker = start_worker(url, "--queues", "batch", "--concurrency", "2",
                          "--prefetch", "0", "--prefetch-max", "0")  # fmt: skip
    active: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while not log.exists() or len(log.read_text().split()) < 10:
            assert time.monotonic() < deadline, worker.tail()
            active.append(queue.counts().active)
            time.sleep(0.02)
        assert [r.get(timeout=20) for r in results] == [f"job-{i}" for i in range(20)]
        assert worker.stop(signal.SIGTERM) == 0, worker.tail()
    finally:
        worker.stop(signal.SIGKILL)
        queue.obliterate()
    assert 0 < max(active) <= 2, active


def test_status_line_on_a_terminal(sample_app: Any, url: str) -> None:
    master, slave = pty.openpty()
    proc = _worker("sample_tasks:app", "--url", url, "--queues", "status",
                   stdout=subprocess.DEVNULL, stderr=slave)  # fmt: skip
    os.close(slave)
    try:
        results = [sample_tasks.add.apply((i, 1), queue="status") for i in range(5)]
        assert [r.get(timeout=15) for r in results] == [1, 2, 3, 4, 5]
        seen = _read_until(master, b"done 5  failed 0", timeout=10)
        assert b"\r\x1b[Kshardq worker  done 5  failed 0  " in seen and b"/s" in seen
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        os.close(master)


def _read_until(fd: int, wanted: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{wanted!r} not shown on the terminal; got {seen[-500:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            seen += os.read(fd, 65536)
    return seen


def test_a_refused_token_stops_the_worker_with_one_clear_line(tmp_path: Path) -> None:
    with ShardqServer(tmp_path / "data", env={"AUTH_TOKENS": "s3cret"}).start() as server:
        host, port = server.tcp_address
        proc = _worker("sample_tasks:app", "--url", f"tcp://{host}:{port}",
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 1, err
        failed = [json.loads(line) for line in err.splitlines() if b'"worker failed"' in line]
        assert failed and "AuthenticationFailed" in failed[0]["error"], err
        assert b"Traceback" not in err


def test_ctrl_c_stops_every_process_gracefully(
    start_worker: Callable[..., WorkerProcess], url: str
) -> None:
    worker = start_worker(url, "--queues", "async", "--processes", "2")
    worker.wait_log("worker process ready", count=2)
    worker.proc.send_signal(signal.SIGINT)  # what the parent gets from a terminal's Ctrl+C
    assert worker.proc.wait(30) == 0, worker.tail()
    stopping = worker.wait_log("stopping: finishing running jobs, giving prefetched ones back", 2)
    assert {line["signal"] for line in stopping} == {"SIGTERM"}  # forwarded once to each
    stopped = worker.wait_log("process stopped", 2)
    assert {line["role"] for line in stopped} == {"worker-0", "worker-1"}
