"""`shardq start` as a process tree: start-up, readiness, restarts, failures, shutdown, logs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from shardq_harness import ShardqServer, poll_until

Factory = Callable[..., ShardqServer]
WAIT_S = 15.0


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _events(server: ShardqServer) -> list[str]:
    return [line["event"] for line in server.logs()]


def test_starts_in_order_logs_one_ready_line_and_stops_cleanly(shardq_server: Factory) -> None:
    server = shardq_server(shards=2)
    ready = server.ready_line
    assert ready is not None
    assert ready["tcp"] == f"127.0.0.1:{server.tcp_port}"
    assert ready["zmq"] == f"tcp://127.0.0.1:{server.zmq_port}"
    assert ready["shards"] == 2 and ready["data_path"] == str(server.data_path)
    assert set(server.child_pids()) == {"writer", "shard-0", "shard-1", "frontend"}
    assert ready["children"] == server.child_pids()
    with socket.create_connection(server.tcp_address, timeout=WAIT_S):
        pass  # the front end listens
    run_dir = server.run_dir
    assert run_dir.is_dir()

    assert server.stop() == 0
    assert not run_dir.exists()
    lines = server.logs()  # strict: every line is a JSON object
    assert all({"timestamp", "level", "event", "role", "pid"} <= line.keys() for line in lines)
    assert {line["role"] for line in lines} == {
        "supervisor", "writer", "shard-0", "shard-1", "frontend"
    }  # fmt: skip
    sup = [(line["event"], line.get("child")) for line in lines if line["role"] == "supervisor"]
    order = [step for step in sup if step[0] in ("child started", "child ready")]
    assert order[:2] == [("child started", "writer"), ("child ready", "writer")]
    assert order[-2:] == [("child started", "frontend"), ("child ready", "frontend")]
    # The shards and the front end are spawned ahead together once the writer runs, so the
    # front end imports while the writer opens and the shards start, not after them.
    ahead = [child for event, child in sup if event == "child spawned ahead"]
    assert ahead == ["shard-0", "shard-1", "frontend"]
    assert sup.index(("child spawned ahead", "frontend")) < sup.index(("child started", "shard-0"))
    assert [e for e, _ in sup].count("shardq ready") == 1
    stopped = [child for event, child in sup if event == "child stopped"]
    assert stopped[0] == "frontend" and stopped[-1] == "writer"  # docs/runtime.md's order
    assert sup[-1] == ("shardq stopped", None)


def test_a_killed_writer_is_restarted_and_logged(shardq_server: Factory) -> None:
    server = shardq_server()
    old = server.child_pids()["writer"]
    os.kill(old, signal.SIGKILL)
    died = server.wait_for_log("child exited unexpectedly", WAIT_S, child="writer")
    assert died["exit"] == "killed by SIGKILL" and died["level"] == "warning"
    server.wait_for_log("child restarted", WAIT_S, child="writer")
    new = server.wait_child_replaced("writer", old, WAIT_S)
    assert new != old and server.child_pids()["writer"] == new
    assert server.returncode is None
    assert server.stop() == 0


def test_too_many_restarts_stop_the_server(shardq_server: Factory) -> None:
    server = shardq_server(env={"SHARDQ_MAX_RESTARTS_PER_MINUTE": "1"})
    children = server.child_pids()
    first = server.child_pids()["writer"]
    os.kill(first, signal.SIGKILL)
    second = server.wait_child_replaced("writer", first, WAIT_S)
    os.kill(second, signal.SIGKILL)
    assert server.wait_exit(WAIT_S) == 1
    failure = server.find_log("shardq is stopping after a failure")
    assert failure is not None and failure["level"] == "error"
    assert "writer" in failure["reason"] and "max_restarts_per_minute = 1" in failure["reason"]
    poll_until(
        lambda: not any(_running(pid) for pid in children.values()), WAIT_S, "children to stop"
    )


@pytest.mark.parametrize("taken", ["tcp_port", "zmq_port"])
def test_a_port_in_use_fails_the_start_naming_it(shardq_server: Factory, taken: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = shardq_server(start=False, **{taken: port})
        server.start(wait=False)
        assert server.wait_exit(WAIT_S) == 1
    line = server.find_log("shardq cannot start")
    assert line is not None and line["level"] == "error"
    assert f"port {port}" in line["error"] and taken in line["error"]
    assert "child started" not in _events(server)


def test_a_data_path_that_cannot_be_created_fails_the_start(
    shardq_server: Factory, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file")
    server = shardq_server(start=False, data_path=blocker / "sub" / "shardq.db")
    server.start(wait=False)
    assert server.wait_exit(WAIT_S) == 1
    line = server.find_log("shardq cannot start")
    assert line is not None and str(blocker / "sub") in line["error"]


def test_a_file_that_is_not_a_database_fails_the_start(
    shardq_server: Factory, tmp_path: Path
) -> None:
    data_path = tmp_path / "data" / "shardq.db"
    data_path.parent.mkdir(parents=True)
    data_path.write_bytes(b"definitely not SQLite " * 200)
    server = shardq_server(start=False)
    server.start(wait=False)
    assert server.wait_exit(WAIT_S) == 1
    failure = server.find_log("shardq is stopping after a failure")
    assert failure is not None
    assert "writer exited during start-up (exit code 3)" in failure["reason"]
    assert "not a SQLite database" in failure["reason"]
    started = [line["child"] for line in server.logs() if line["event"] == "child started"]
    assert started == ["writer"]  # nothing else was spawned
    assert data_path.read_bytes().startswith(b"definitely not SQLite")  # left untouched


@pytest.mark.parametrize(
    ("args", "key"),
    [(["--shards", "0"], "shards"), (["--log-level", "chatty"], "log_level")],
)
def test_a_bad_setting_exits_2_naming_it(shardq_server: Factory, args: list[str], key: str) -> None:
    server = shardq_server(start=False, args=args)
    server.start(wait=False)
    assert server.wait_exit(WAIT_S) == 2
    [line] = server.logs()
    assert line["event"] == "invalid configuration" and key in line["error"]


def test_an_unknown_key_in_the_config_file_exits_2(shardq_server: Factory, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("shards = 1\nflush_intervall_ms = 5\n")
    server = shardq_server(start=False, args=["--config", str(config)])
    server.start(wait=False)
    assert server.wait_exit(WAIT_S) == 2
    [line] = server.logs()
    assert "unknown config key 'flush_intervall_ms'" in line["error"]


def test_bunqueue_environment_names_configure_the_server(
    shardq_server: Factory, tmp_path: Path
) -> None:
    data_path = tmp_path / "bq" / "queue.db"
    server = shardq_server(via_env=True, data_path=data_path)
    assert "--tcp-port" not in server.command()
    assert server.ready_line is not None
    assert server.ready_line["tcp"] == f"127.0.0.1:{server.tcp_port}"
    assert server.ready_line["data_path"] == str(data_path)
    assert server.stop() == 0
    assert data_path.exists()


def test_a_second_signal_kills_every_child_and_exits_1(shardq_server: Factory) -> None:
    server = shardq_server(env={"SHARDQ_SHUTDOWN_TIMEOUT_MS": "20000"})
    children = server.child_pids()
    run_dir = server.run_dir
    # A front end that cannot react keeps the graceful shutdown waiting.
    os.kill(children["frontend"], signal.SIGSTOP)
    server.signal(signal.SIGTERM)
    server.wait_for_log("shutdown requested", WAIT_S)
    server.signal(signal.SIGINT)  # a different signal: two SIGTERMs could merge into one
    assert server.wait_exit(WAIT_S) == 1
    assert server.find_log("second stop signal: killing every child") is not None
    poll_until(
        lambda: not any(_running(pid) for pid in children.values()), WAIT_S, "children to die"
    )
    assert not run_dir.exists()


def test_kill9_of_the_tree_then_a_restart_on_the_same_data(shardq_server: Factory) -> None:
    # A short data dir, so the run dir is `<data dir>/run-<pid>` itself whatever the test
    # runner's temp path (the long-path case, a link to a temporary dir, is the test below).
    short = Path(tempfile.mkdtemp(prefix="sq-", dir="/tmp"))
    try:
        first = shardq_server(data_dir=short / "data")
        stale_run_dir = first.run_dir
        assert stale_run_dir.parent == short / "data"
        killed = first.kill9_tree()
        assert len(killed) == 4 and not any(_running(pid) for pid in killed)
        assert stale_run_dir.exists()  # nobody could clean up

        second = shardq_server(data_dir=short / "data")  # same data dir, new ports
        assert second.find_log("removed a stale run directory", path=str(stale_run_dir))
        assert not stale_run_dir.exists()
        assert second.stop() == 0
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_a_long_data_dir_gets_a_short_run_dir_and_a_kill9_leaves_nothing_after_a_restart(
    shardq_server: Factory, tmp_path: Path
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    first = shardq_server(data_dir=deep)
    temporary, link = first.run_dir, deep / f"run-{first.pid}"
    assert len(str(temporary)) < 60 and temporary.is_dir()
    assert link.is_symlink() and link.resolve() == temporary.resolve()
    first.kill9_tree()
    assert temporary.is_dir()  # nobody could clean up

    second = shardq_server(data_dir=deep)
    assert second.find_log("removed a stale run directory", path=str(link))
    assert not temporary.exists() and not link.is_symlink()
    run_dir = second.run_dir
    assert len(str(run_dir)) < 60 and run_dir.is_dir()
    assert second.stop() == 0
    # A clean stop removes its short run dir and the link to it.
    assert not run_dir.exists() and not (deep / f"run-{second.pid}").is_symlink()
    assert not any(p.name.startswith("run-") for p in deep.iterdir())


def _cli(*args: str) -> tuple[str, set[str]]:
    """`shardq ARGS` run with `-X importtime`: its output and the modules it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "shardq_cli.main", *args],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return done.stdout, imported


def test_shardq_start_imports_none_of_the_other_commands_modules() -> None:
    # The server's start waits for the command line: `start` loads only what it needs.
    out, imported = _cli("start", "--help")
    assert "Start the server" in out
    assert not {"shardq_cli._admin", "shardq.client", "shardq_cli._storage"} & imported
    # Every other invocation has every command.
    out, imported = _cli("--help")
    assert "status" in out and "storage" in out and "start" in out
    assert "shardq_cli._admin" in imported


def _sigterm_state(pid: int) -> tuple[bool, bool]:
    """(whether `pid` installed a SIGTERM handler, whether a SIGTERM waits for it), from the
    SigCgt and ShdPnd/SigPnd masks of /proc."""
    masks = dict(
        line.split(":", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith(("SigCgt:", "ShdPnd:", "SigPnd:"))
    )
    bit = 1 << (signal.SIGTERM - 1)
    pending = int(masks["ShdPnd"], 16) | int(masks["SigPnd"], 16)
    return bool(int(masks["SigCgt"], 16) & bit), bool(pending & bit)


def _new_writer(server: ShardqServer, old: set[int]) -> int | None:
    """A child of the supervisor not in `old` that runs the writer's program (past its exec:
    before it, the forked copy has the supervisor's handlers), as /proc shows it at once."""
    return _new_child(server, old, "writer")


def _reconnects(server: ShardqServer) -> int:
    """How many times the front end has logged shard 0's link back."""
    return sum(
        1
        for line in server.logs()
        if line["event"] == "shard link reconnected" and line.get("shard") == 0
    )


def _new_child(server: ShardqServer, old: set[int], role: str) -> int | None:
    """A child of the supervisor not in `old` that runs `shardq.runtime.<role>`."""
    task = Path(f"/proc/{server.pid}/task/{server.pid}/children")
    for pid in {int(p) for p in task.read_text().split()} - old:
        try:
            if f"shardq.runtime.{role}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def test_a_stop_that_ends_a_writer_still_importing_is_clean(shardq_server: Factory) -> None:
    """A stop that comes while the supervisor starts the writer again (after a crash here;
    after a recycle in `test_writer_recycle`): its SIGTERM ends a writer still importing its
    modules, which held nothing. That stop is clean (exit 0); it once exited 1."""
    server = shardq_server(shards=1)
    # Catch a restarted writer before its SIGTERM handler (its imports take a good part of a
    # second of CPU; /proc shows it at once): a few tries at most.
    for _ in range(3):
        children = set(server.child_pids().values())
        old = server.child_pids()["writer"]
        os.kill(old, signal.SIGKILL)
        new: int = poll_until(partial(_new_writer, server, children), WAIT_S, "a new writer")
        os.kill(new, signal.SIGSTOP)
        if not _sigterm_state(new)[0]:
            break
        os.kill(new, signal.SIGCONT)
        server.wait_child_replaced("writer", old, WAIT_S)
    else:
        raise AssertionError("no restarted writer was caught before its SIGTERM handler")
    os.kill(server.pid, signal.SIGTERM)  # the stop, as `server.stop()` begins it
    # The stop reaches the writer last: its SIGTERM waits in the stopped process.
    poll_until(lambda: _sigterm_state(new)[1], WAIT_S, "the stop's SIGTERM to the writer")
    os.kill(new, signal.SIGCONT)  # and ends it, by the signal's default action
    assert server.wait_exit(WAIT_S) == 0, server.log_tail()
    stopped = server.find_log("child stopped", child="writer")
    assert stopped is not None and stopped["exit"] == "killed by SIGTERM", stopped


def test_a_stop_while_a_shard_restarts_ends_when_it_is_drained(shardq_server: Factory) -> None:
    """A stop that comes while a crashed shard starts again: the front end's `drain` to it was
    lost with the old process, so the new one is asked once it is up, and the stop ends when
    it reports drained. It once waited out the whole `shutdown_timeout_ms` (30 s)."""
    server = shardq_server(shards=2)
    # Catch a restarted shard while it imports, before its link is back: a few tries at most
    # (on a loaded machine the test may look only after the new shard is up).
    for _ in range(3):
        children = set(server.child_pids().values())
        links = _reconnects(server)
        old = server.child_pids()["shard-0"]
        os.kill(old, signal.SIGKILL)
        new: int = poll_until(
            partial(_new_child, server, children, "shard"), WAIT_S, "a new shard", step=0.002
        )
        os.kill(new, signal.SIGSTOP)  # held while it imports, long before it can be up
        time.sleep(0.2)  # a link that did come back is logged by now
        if _reconnects(server) == links:
            break
        os.kill(new, signal.SIGCONT)
        server.wait_child_replaced("shard-0", old, WAIT_S)
    else:
        raise AssertionError("no restarted shard was caught before its link came back")
    os.kill(server.pid, signal.SIGTERM)
    poll_until(lambda: server.find_log("front end draining"), WAIT_S, "the front end's drain")
    os.kill(new, signal.SIGCONT)
    assert server.wait_exit(WAIT_S) == 0, server.log_tail()  # WAIT_S: half the drain timeout
    events = [(line["event"], line.get("shard")) for line in server.logs()]
    # The drain began while shard 0 was down: its link came back after it.
    last_link = len(events) - 1 - events[::-1].index(("shard link reconnected", 0))
    assert events.index(("front end draining", None)) < last_link, events
    assert ("drain timeout; closing with jobs active", None) not in events, events
