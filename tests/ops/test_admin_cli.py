"""The admin commands, run through the real `shardq` entry point against a real server, and
once each against a stopped server (a one-line error and a non-zero status, no traceback)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ops_helpers import SHARDQ, run_cli
from shardq_cli.main import app
from shardq_harness import ShardqServer, free_port
from typer.testing import CliRunner

from shardq.client import Queue

# Every admin command with the arguments it needs; `{id}` is replaced by a job id.
COMMANDS: list[list[str]] = [
    ["status"],
    ["status", "--json"],
    ["queue", "list"],
    ["queue", "pause", "q"],
    ["queue", "resume", "q"],
    ["queue", "drain", "q"],
    ["queue", "clean", "q"],
    ["queue", "obliterate", "q", "--yes"],
    ["job", "get", "{id}"],
    ["job", "retry", "{id}"],
    ["job", "cancel", "{id}"],
    ["job", "promote", "{id}"],
    ["dlq", "list", "q"],
    ["dlq", "retry", "q"],
    ["dlq", "purge", "q", "--yes"],
    ["push", "q", "{}"],
    ["pull", "q"],
    ["top", "--iterations", "1"],
]


def _url(server: ShardqServer) -> str:
    return f"tcp://127.0.0.1:{server.tcp_port}"


def _command_path(command: list[str]) -> list[str]:
    """The words naming the command: `queue pause`, `status`, `top`."""
    return command[:2] if command[0] in ("queue", "job", "dlq") else command[:1]


def test_every_command_has_help() -> None:
    # In-process (typer's runner): the help text is the same, and 18 interpreters are slow.
    runner = CliRunner()
    for command in COMMANDS:
        result = runner.invoke(app, [*_command_path(command), "--help"], env={"COLUMNS": "160"})
        assert result.exit_code == 0, (command, result.output)
        assert "--url" in result.output and "--token" in result.output, command


def test_every_command_fails_in_one_line_when_the_server_is_down() -> None:
    url = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    commands = [[a.replace("{id}", "x") for a in c] + ["--url", url] for c in COMMANDS]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run_cli, commands))
    for command, result in zip(commands, results, strict=True):
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (command, result.stderr)
        assert lines[0].startswith("shardq: ") and "refused" in lines[0], command
        assert "Traceback" not in result.stderr


def test_status_and_queue_commands_against_a_live_server(server: ShardqServer) -> None:
    url = _url(server)
    pushed = run_cli(["push", "emails", '{"to": "a@b.c"}', "--name", "welcome", "--url", url])
    assert pushed.returncode == 0, pushed.stderr
    job_id = pushed.stdout.strip()
    delayed = run_cli(["push", "emails", "{}", "--options", '{"delay": 600000}', "--url", url])
    delayed_id = delayed.stdout.strip()

    status = json.loads(run_cli(["status", "--json", "--url", url]).stdout)
    assert status["healthy"] is True
    assert status["queues"]["emails"]["waiting"] == 1
    assert status["queues"]["emails"]["delayed"] == 1
    table = run_cli(["status", "--url", url])
    assert "healthy" in table.stdout and "emails" in table.stdout

    assert run_cli(["queue", "pause", "emails", "--url", url]).returncode == 0
    listed = json.loads(run_cli(["queue", "list", "--json", "--url", url]).stdout)
    assert listed["emails"]["paused"] is True
    assert "PAUSED" in run_cli(["queue", "list", "--url", url]).stdout
    assert run_cli(["pull", "emails", "--url", url]).returncode == 3  # paused: nothing handed out
    assert run_cli(["queue", "resume", "emails", "--url", url]).returncode == 0

    job = json.loads(run_cli(["job", "get", job_id, "--json", "--url", url]).stdout)
    assert job["name"] == "welcome" and job["data"] == {"to": "a@b.c"}
    assert run_cli(["job", "promote", delayed_id, "--url", url]).returncode == 0
    assert run_cli(["job", "cancel", delayed_id, "--url", url]).returncode == 0

    pulled = run_cli(["pull", "emails", "--ack", "--json", "--url", url])
    assert json.loads(pulled.stdout)["id"] == job_id
    assert "cleaned 1 completed" in run_cli(["queue", "clean", "emails", "--url", url]).stdout

    with Queue("emails", url) as queue:  # setup through the SDK: fewer interpreters to start
        assert queue.get_state(delayed_id) == "unknown"  # cancelled
        queue.add("a")
        assert "drained 1" in run_cli(["queue", "drain", "emails", "--url", url]).stdout
        queue.add("b")
        assert run_cli(["queue", "obliterate", "emails", "--yes", "--url", url]).returncode == 0
        assert queue.counts().waiting == 0


def test_job_and_dlq_commands_against_a_live_server(server: ShardqServer) -> None:
    url = _url(server)
    with Queue("work", url) as queue:
        job_id = queue.add("boom", {"n": 1}, {"maxAttempts": 1})
        conn = queue.connection
        pulled = conn.call({"cmd": "PULL", "queue": "work"})["job"]
        conn.call({"cmd": "FAIL", "id": pulled["id"], "error": "kaput"})
    entries = json.loads(run_cli(["dlq", "list", "work", "--json", "--url", url]).stdout)
    assert [e["job"]["id"] for e in entries] == [job_id]
    assert "kaput" in run_cli(["dlq", "list", "work", "--url", url]).stdout

    retried = run_cli(["job", "retry", job_id, "--url", url])
    assert retried.returncode == 0, retried.stderr
    again = run_cli(["job", "retry", job_id, "--url", url])  # waiting now: refused, one line
    assert again.returncode == 1 and "only failed or completed" in again.stderr

    with Queue("work", url) as queue:
        pulled = queue.connection.call({"cmd": "PULL", "queue": "work"})["job"]
        queue.connection.call({"cmd": "FAIL", "id": pulled["id"], "error": "kaput"})
    assert "retried 1" in run_cli(["dlq", "retry", "work", "--url", url]).stdout
    with Queue("work", url) as queue:
        pulled = queue.connection.call({"cmd": "PULL", "queue": "work"})["job"]
        queue.connection.call({"cmd": "FAIL", "id": pulled["id"], "error": "kaput"})
    assert "purged 1" in run_cli(["dlq", "purge", "work", "--yes", "--url", url]).stdout
    missing = run_cli(["job", "get", "no-such-job", "--url", url])
    assert missing.returncode == 1 and "not found" in missing.stderr.lower()


def test_token_comes_from_the_environment(tmp_path: Path) -> None:
    env = {"SHARDQ_AUTH_TOKENS": "s3cret"}
    with ShardqServer(tmp_path / "data", shards=1, env=env).start() as srv:
        url = _url(srv)
        refused = run_cli(["status", "--url", url])
        assert refused.returncode == 1 and "Not authenticated" in refused.stderr
        ok = run_cli(["status", "--url", url], env={"SHARDQ_TOKEN": "s3cret"})
        assert ok.returncode == 0, ok.stderr
        wrong = run_cli(["queue", "list", "--url", url], env={"SHARDQ_TOKEN": "nope"})
        assert wrong.returncode == 1 and "Invalid token" in wrong.stderr


def test_top_draws_rates_queues_and_workers_on_a_terminal(server: ShardqServer) -> None:
    url = _url(server)
    with Queue("images", url) as queue:
        queue.add_bulk([("resize", {"n": i}) for i in range(50)])
        queue.connection.call({"cmd": "RegisterWorker", "name": "resizer", "queues": ["images"]})
        # `top` runs on a pseudo-terminal, so rich draws its live view as it would for a person.
        screen = _run_on_pty(["top", "--url", url, "--interval", "0.5", "--iterations", "3"])
    assert "shardq top" in screen and "push" in screen and "/s" in screen
    assert "images" in screen and "50" in screen  # the queue and its depth
    assert "resizer" in screen  # the registered worker
    assert "resident" in screen and "cold" in screen  # the shards' jobs in memory and not
    assert "budget" in screen and "/ 256" in screen  # the default memory budget, 256 MiB


def _run_on_pty(args: list[str]) -> str:
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    env.update(COLUMNS="120", LINES="40", TERM="xterm")
    proc = subprocess.Popen([SHARDQ, *args], stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(30) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")
