"""One server per data path: the supervisor `flock`s `<data_path>.lock` before it starts any
child, and a second `shardq start` on the same data path exits 1 naming the path and the PID
that holds it. A lock left by `kill -9` never blocks the next start."""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from shardq_harness import ShardqServer
from wire_clients import Tcp

Factory = Callable[..., ShardqServer]
WAIT_S = 30


def _lock_file(server: ShardqServer) -> Path:
    return server.data_path.with_name(server.data_path.name + ".lock")


def _serves(server: ShardqServer) -> bool:
    client = Tcp(server.tcp_address)
    try:
        return bool(client.call({"cmd": "Ping"})["ok"])
    finally:
        client.close()


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """The server holding the lock, for the tests whose second start is refused before any
    child (nothing of the first changes): started once instead of once per test, and it still
    serves and stops cleanly (exit 0) at the end. Each second server has a log dir of its
    own."""
    data = tmp_path_factory.mktemp("first") / "data"
    with ShardqServer(data).start() as server:
        yield server
        assert _serves(server)
        assert server.stop() == 0, server.log_tail()


def _refused(second: ShardqServer) -> str:
    """Start `second`, expect exit 1 before any child; return its error line."""
    second.start(wait=False)
    assert second.wait_exit(WAIT_S) == 1, second.log_tail()
    line = second.find_log("shardq cannot start")
    assert line is not None and line["level"] == "error", second.log_tail()
    events = [entry.get("event") for entry in second.logs(strict=False)]
    assert "child started" not in events
    return str(line["error"])


@pytest.mark.parametrize("same_ports", [False, True])
def test_a_second_server_on_the_same_data_path_exits_1_naming_path_and_pid(
    first: ShardqServer, shardq_server: Factory, tmp_path: Path, same_ports: bool
) -> None:
    assert _lock_file(first).read_text().strip() == str(first.pid)
    ports = {"tcp_port": first.tcp_port, "zmq_port": first.zmq_port} if same_ports else {}
    # Its own log dir, the same database file.
    second = shardq_server(
        start=False, data_dir=tmp_path / "second", data_path=first.data_path, **ports
    )
    error = _refused(second)
    # Named as the operator gave it, whatever the ports: the data path is the conflict.
    assert str(first.data_path) in error and f"PID {first.pid}" in error, error
    assert _serves(first)  # the first server did not notice


def test_a_symlinked_spelling_of_the_data_path_is_the_same_server(
    first: ShardqServer, shardq_server: Factory, tmp_path: Path
) -> None:
    alias = tmp_path / "alias.db"  # another name for the same database file
    alias.symlink_to(first.data_path)
    second = shardq_server(start=False, data_dir=tmp_path / "second", data_path=alias)
    error = _refused(second)
    assert str(alias) in error and f"PID {first.pid}" in error, error
    assert _serves(first)


def test_a_lock_held_by_another_process_blocks_the_start(
    shardq_server: Factory, tmp_path: Path
) -> None:
    data_path = tmp_path / "data" / "shardq.db"
    data_path.parent.mkdir(parents=True)
    lock = data_path.with_name("shardq.db.lock")
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write(f"{os.getpid()}\n")
        held.flush()
        error = _refused(shardq_server(start=False, data_path=data_path))
    assert f"PID {os.getpid()}" in error and str(data_path) in error
    # Released: the same server starts now, and the lock file names it.
    server = shardq_server(data_path=data_path)
    assert lock.read_text().strip() == str(server.pid)
    assert server.stop() == 0


def test_a_lock_left_by_kill9_never_blocks_the_next_start(shardq_server: Factory) -> None:
    first = shardq_server()
    first.kill9_tree()
    assert _lock_file(first).read_text().strip() == str(first.pid)  # left behind, stale
    second = shardq_server()  # the same data dir, at once
    assert _lock_file(second).read_text().strip() == str(second.pid)
    assert _serves(second)
    # Only the supervisor killed: its children die with it, and the lock goes with it too.
    second.signal(signal.SIGKILL)
    second.wait_exit(WAIT_S)
    third = shardq_server()
    assert _serves(third)
    assert third.stop() == 0
    # A clean stop leaves the file, emptied: no PID that could name an unrelated process.
    assert _lock_file(third).read_text() == ""
