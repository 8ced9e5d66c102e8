"""Where the SDK's `Worker` logs, seen from outside: a program run as a subprocess against the
real server, its stdout and stderr captured. By default failures are JSON lines on stderr and
stdout stays the program's; an application's `logging` setup receives them instead; and a
`run_until_idle` that times out with failing jobs leaves no "Task exception was never
retrieved" behind."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from shardq_harness import ShardqServer

PROGRAM = """
import logging, sys
from shardq.client import Queue, Worker
from shardq.errors import ShardqError

URL, QUEUE, SETUP = sys.argv[1], sys.argv[2], sys.argv[3]
if SETUP == "logging":
    logging.basicConfig(stream=sys.stdout, format="APP %(name)s %(levelname)s %(message)s")

def boom(job):
    raise ValueError("kaput")

with Queue(QUEUE, url=URL) as queue:
    for i in range(3):
        queue.add("x", {"i": i}, {"backoff": 60000})  # retried in a minute: never idle in time
    try:
        Worker(QUEUE, boom, url=URL, concurrency=2).run_until_idle(timeout=2)
    except ShardqError as e:
        print("ended:", type(e).__name__)
"""


def _run(server: ShardqServer, setup: str) -> subprocess.CompletedProcess[str]:
    url = f"tcp://127.0.0.1:{server.tcp_port}"
    queue = f"log-{uuid.uuid4().hex[:8]}"
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, url, queue, setup],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_failures_are_json_on_stderr_and_nothing_is_left_unretrieved(
    server: ShardqServer,
) -> None:
    done = _run(server, "none")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ended: WaitTimeout"  # stdout is the program's alone
    assert "Task exception was never retrieved" not in done.stderr
    assert "Traceback" not in done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    failed = [line for line in lines if line["event"] == "job failed"]
    assert len(failed) == 3
    assert all(line["level"] == "warning" and "kaput" in line["error"] for line in failed)
    assert all(line["logger"] == "shardq.client" and line["job_id"] for line in failed)


def test_an_application_logging_setup_receives_the_failures(server: ShardqServer) -> None:
    done = _run(server, "logging")
    assert done.returncode == 0, done.stderr
    assert "Task exception was never retrieved" not in done.stderr
    app_lines = [line for line in done.stdout.splitlines() if line.startswith("APP ")]
    failed = [line for line in app_lines if "job failed" in line]
    assert len(failed) == 3, done.stdout
    assert all(line.startswith("APP shardq.client WARNING job failed") for line in failed)
    assert all("kaput" in line for line in failed)
    assert not any(line.startswith("{") for line in done.stderr.splitlines())
