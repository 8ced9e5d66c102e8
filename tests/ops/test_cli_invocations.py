"""The CLI as a user meets it: bad invocations, readable reads, `--json`, `--version`, and
backups asked of the server from another directory. Every case runs the real `shardq`
console script as a subprocess against a real server (or a port where none listens)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ops_helpers import SHARDQ, run_cli
from shardq_harness import ShardqServer, free_port, free_ports

import shardq
from shardq.client import Queue

# Each entry: the arguments, with {url} for the live server and {down} for a dead port.
BAD: list[list[str]] = [
    # flags and values
    ["--nope"],
    ["nosuchcommand"],
    ["status", "--nope"],
    ["status", "--url"],
    ["status", "--url", "nonsense"],
    ["status", "--url", "http://127.0.0.1:1"],
    ["status", "--url", "tcp://127.0.0.1:99999"],
    ["status", "--url", "tcp://"],
    ["queue"],
    ["queue", "frobnicate", "q"],
    ["queue", "pause"],
    ["queue", "clean", "q", "--limit", "0", "--url", "{url}"],
    ["queue", "clean", "q", "--limit", "many", "--url", "{url}"],
    ["queue", "clean", "q", "--grace", "-5", "--url", "{url}"],
    ["queue", "clean", "emails", "--state", "bogus", "--url", "{url}"],
    ["queue", "clean", "emails", "--state", "active", "--url", "{url}"],
    ["queue", "clean", "emails", "--state", "nonsense", "--url", "{down}"],
    ["job", "list", "emails", "--state", "bogus", "--url", "{url}"],
    ["job", "list", "emails", "--limit", "0", "--url", "{url}"],
    ["job", "list", "emails", "--limit", "1000000", "--url", "{url}"],
    ["job", "list"],
    ["job", "get"],
    ["job", "get", "no-such-job", "--url", "{url}"],
    ["job", "retry", "no-such-job", "--url", "{url}"],
    ["job", "promote", "no-such-job", "--url", "{url}"],
    ["dlq", "list", "emails", "--count", "-1", "--url", "{url}"],
    ["dlq", "retry", "emails", "--count", "zero", "--url", "{url}"],
    # JSON
    ["push", "emails", "{not json", "--url", "{url}"],
    ["push", "emails", "{}", "--options", "[1, 2]", "--url", "{url}"],
    ["push", "emails", "{}", "--options", "{bad", "--url", "{url}"],
    ["push", "emails"],
    ["push"],
    ["pull", "emails", "--wait", "-1", "--url", "{url}"],
    ["pull", "emails", "--wait", "nan", "--url", "{url}"],
    ["pull", "emails", "--wait", "1e400", "--url", "{url}"],
    ["pull", "emails", "--url", "zmq://127.0.0.1:1"],
    # unknown queues
    ["queue", "pause", "nosuchqueue", "--url", "{url}"],
    ["queue", "resume", "nosuchqueue", "--url", "{url}"],
    ["queue", "drain", "nosuchqueue", "--url", "{url}"],
    ["queue", "clean", "nosuchqueue", "--url", "{url}"],
    ["queue", "obliterate", "nosuchqueue", "--yes", "--url", "{url}"],
    ["dlq", "list", "nosuchqueue", "--url", "{url}"],
    ["dlq", "purge", "nosuchqueue", "--yes", "--url", "{url}"],
    ["job", "list", "nosuchqueue", "--url", "{url}"],
    # server down
    ["status", "--url", "{down}"],
    ["queue", "list", "--url", "{down}"],
    ["job", "get", "x", "--url", "{down}"],
    ["backup", "now", "--url", "{down}"],
    ["backup", "status", "--json", "--url", "{down}"],
    ["top", "--iterations", "1", "--url", "{down}"],
    # start and worker refuse bad settings before doing anything
    ["start", "--log-format", "xml"],
    ["start", "--log-level", "loud"],
    ["start", "--shards", "-3", "--tcp-port", "0", "--data-path", "{tmp}/x.db"],
    ["worker", "no_such_module:app"],
    ["worker", "nocolon"],
    ["worker", "broken_app:app", "--url", "{down}"],  # a module that raises when imported
    ["soak", "--config", "{tmp}/missing.toml", "--seconds", "1"],
    ["zmq-keygen", "{tmp}/keys"],  # a second time: the key files exist
    ["zmq-keygen", "/proc/no/such/dir"],
    # backups
    ["backup", "verify", "no-such-backup", "--url", "{url}"],
    ["backup", "restore"],
    ["backup", "now", "--data-path", "{tmp}/missing.db", "--dir", "{tmp}/bk"],
]


@pytest.fixture(scope="module")
def backups(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The live server's backup destination; only the backups test takes backups."""
    return tmp_path_factory.mktemp("backups")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, backups: Path) -> Iterator[ShardqServer]:
    """One server for the module: each test uses queues of its own ("emails", "mail", "work",
    "kept"), and a start costs more than most of these tests."""
    env = {"SHARDQ_BACKUP_DIR": str(backups)}
    data = tmp_path_factory.mktemp("live") / "data"
    with ShardqServer(data, shards=1, env=env).start() as srv:
        yield srv


def _url(server: ShardqServer) -> str:
    return f"tcp://127.0.0.1:{server.tcp_port}"


def test_no_bad_invocation_prints_a_traceback_or_exits_zero(
    live: ShardqServer, tmp_path: Path
) -> None:
    with Queue("emails", _url(live)) as queue:
        queue.add("welcome", {"to": "a@b.c"})
        held = queue.connection.call({"cmd": "ListQueues"})["queues"]
    assert "emails" in held and "nosuchqueue" not in held
    down = f"tcp://127.0.0.1:{free_port()}"
    fill = {"{url}": _url(live), "{down}": down, "{tmp}": str(tmp_path)}
    commands = [[_fill(a, fill) for a in c] for c in BAD]
    assert len(commands) >= 50
    assert run_cli(["zmq-keygen", str(tmp_path / "keys")]).returncode == 0
    (tmp_path / "broken_app.py").write_text("raise RuntimeError('broken at import')\n")
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: run_cli(c, timeout=60, cwd=tmp_path), commands))
    wrong = [
        (command, result.returncode, result.stdout[-300:], result.stderr[-300:])
        for command, result in zip(commands, results, strict=True)
        if result.returncode == 0
        or "Traceback" in result.stderr + result.stdout
        or "unexpected error" in result.stderr  # the last-resort catch: each case is foreseen
        or not (result.stderr + result.stdout).strip()  # it says why (help, for a bare group)
    ]
    assert wrong == []
    by_command = dict(zip(map(tuple, commands), results, strict=True))
    downed = by_command[("status", "--url", down)]
    assert downed.stderr.count(down.split("://")[1]) == 1, downed.stderr  # the URL once
    assert "start it with: shardq start" in downed.stderr
    bogus = by_command[tuple(_fill(a, fill) for a in BAD[14])]
    assert "'bogus' is not one of" in bogus.stderr and bogus.returncode == 2
    phantom = by_command[("queue", "pause", "nosuchqueue", "--url", _url(live))]
    assert "unknown queue 'nosuchqueue'" in phantom.stderr and "emails" in phantom.stderr
    with Queue("emails", _url(live)) as queue:  # nothing was created or paused by a refusal
        listed = queue.connection.call({"cmd": "ListQueues"})["queues"]
        assert sorted(listed) == sorted(held)
        assert queue.connection.call({"cmd": "IsPaused", "queue": "emails"})["paused"] is False


def _fill(arg: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        arg = arg.replace(key, value)
    return arg


def test_version_reads_and_json(live: ShardqServer) -> None:
    url = _url(live)
    version = run_cli(["--version"])
    assert version.returncode == 0 and version.stdout.strip() == f"shardq {shardq.__version__}"
    with Queue("mail", url) as queue:
        first = queue.add("welcome", {"to": "a@b.c"})
        second = queue.add("reset", {"to": "d@e.f"}, {"delay": 600_000})
    job = run_cli(["job", "get", first, "--url", url])
    assert job.returncode == 0, job.stderr
    assert f"job {first}" in job.stdout and "state     waiting" in job.stdout
    assert "(now)" in job.stdout or "s ago)" in job.stdout  # a local time with its age
    assert len(job.stdout.splitlines()) < 12
    full = json.loads(run_cli(["job", "get", first, "--json", "--url", url]).stdout)
    assert full["id"] == first and full["data"] == {"to": "a@b.c"}

    listed = json.loads(run_cli(["job", "list", "mail", "--json", "--url", url]).stdout)
    assert [j["id"] for j in listed] == [first, second]
    delayed = run_cli(["job", "list", "mail", "--state", "delayed", "--url", url])
    assert second in delayed.stdout and first not in delayed.stdout
    one = json.loads(
        run_cli(["job", "list", "mail", "--limit", "1", "--json", "--url", url]).stdout
    )
    assert len(one) == 1

    pulled = run_cli(["pull", "mail", "--ack", "--url", url])
    assert pulled.returncode == 0 and f"job {first}" in pulled.stdout
    assert "{" not in pulled.stdout.splitlines()[0]  # a summary, not a JSON dump
    assert run_cli(["queue", "pause", "mail", "--url", url]).returncode == 0
    table = run_cli(["queue", "list", "--url", url]).stdout
    assert "PAUSED" in table and "PAUSED: mail" in table
    status = run_cli(["status", "--url", url]).stdout
    assert "PAUSED: mail" in status
    empty = run_cli(["pull", "mail", "--url", url])
    assert empty.returncode == 3 and "PAUSED" in empty.stderr


def test_dlq_list_shows_local_times_not_epoch_floats(live: ShardqServer) -> None:
    url = _url(live)
    with Queue("work", url) as queue:
        queue.add("boom", {}, {"maxAttempts": 1})
        conn = queue.connection
        pulled = conn.call({"cmd": "PULL", "queue": "work"})["job"]
        conn.call({"cmd": "FAIL", "id": pulled["id"], "error": "kaput"})
    shown = run_cli(["dlq", "list", "work", "--url", url])
    assert shown.returncode == 0 and "kaput" in shown.stdout
    assert "ago)" in shown.stdout or "(now)" in shown.stdout
    entered = json.loads(run_cli(["dlq", "list", "work", "--json", "--url", url]).stdout)[0]
    assert str(entered["enteredAt"]) not in shown.stdout


def test_backups_through_the_server_from_another_directory(
    live: ShardqServer, backups: Path, tmp_path: Path
) -> None:
    url = _url(live)
    with Queue("kept", url) as queue:
        queue.add("a", {"n": 1})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDQ_", "S3_"))}
        return subprocess.run(
            [SHARDQ, *args, "--url", url], cwd=elsewhere, capture_output=True, text=True,
            env=env, timeout=60, check=False,
        )  # fmt: skip

    taken = cli("backup", "now", "--json")
    assert taken.returncode == 0, taken.stderr
    key = json.loads(taken.stdout)["key"]
    assert (backups / key).exists()  # the server's destination, not the cwd
    assert list(elsewhere.iterdir()) == []
    listed = cli("backup", "list", "--json")
    assert [b["key"] for b in json.loads(listed.stdout)] == [key]
    assert key in cli("backup", "list").stdout
    status = json.loads(cli("backup", "status", "--json").stdout)
    assert status["backups"] == 1 and status["newest"]["key"] == key
    readable = cli("backup", "status").stdout
    assert "destination" in readable and "{" not in readable
    verified = cli("backup", "verify", key)
    assert verified.returncode == 0 and "intact" in verified.stdout, verified.stderr
    # A damaged backup is refused by verify, naming the problem.
    payload = backups / key
    payload.write_bytes(payload.read_bytes()[:100])
    damaged = cli("backup", "verify", key)
    assert damaged.returncode == 1 and "truncated or corrupt" in damaged.stderr


def _start_on_a_terminal(tmp_path: Path, *flags: str) -> str:
    """`shardq start` on a pseudo-terminal until it logs `shardq ready`, then SIGTERM; what
    it wrote."""
    tcp, zmq_port = free_ports(2)
    args = [
        SHARDQ,
        "start",
        "--tcp-port",
        str(tcp),
        "--zmq-port",
        str(zmq_port),
        "--http-port",
        "0",
        "--shards",
        "1",
        "--data-path",
        str(tmp_path / "db"),
        *flags,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDQ_", "S3_"))}
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                            env=env, start_new_session=True)  # fmt: skip
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while b"shardq ready" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        os.close(leader)
    return seen.decode(errors="replace")


@pytest.mark.parametrize(("flags", "json_lines"), [((), False), (("--log-format", "json"), True)])
def test_start_logs_readable_lines_on_a_terminal_unless_asked_for_json(
    tmp_path: Path, flags: tuple[str, ...], json_lines: bool
) -> None:
    shown = _start_on_a_terminal(tmp_path, *flags)
    ready = next((line for line in shown.splitlines() if "shardq ready" in line), None)
    assert ready is not None, shown[-2000:]
    assert ready.lstrip().startswith("{") is json_lines, ready
