"""Checks the supervisor runs before it spawns anything, and the run directory it creates.

Each check raises `StartupError` with a message an operator can act on (it names the port or
the path), so `shardq start` fails in a second with a clear line instead of a child dying later
with a vaguer one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from shardq.errors import ShardqError
from shardq.runtime._config import ServerConfig

__all__ = [
    "StartupError",
    "check_data_path",
    "check_ports",
    "make_run_dir",
    "remove_run_dir",
    "remove_stale_run_dirs",
]

# A Unix socket path must fit sockaddr_un.sun_path (108 bytes on Linux, 104 on macOS, NUL
# included); 90 leaves room for the longest socket name we append.
MAX_IPC_PATH = 90
_RUN_DIR = re.compile(r"run-(\d+)")
_TEMP_PREFIX = "shardq-run-"


class StartupError(ShardqError):
    """shardq cannot start; the message says why and names the port or path at fault."""


def check_ports(config: ServerConfig) -> None:
    """Raise `StartupError` if the TCP, ZeroMQ or HTTP port (0: off) is taken, shared, or
    cannot be bound."""
    ports = {"tcp_port": config.tcp.tcp_port, "zmq_port": config.tcp.zmq_port}
    if config.http.http_port:
        ports["http_port"] = config.http.http_port
    seen: dict[int, str] = {}
    for key, port in ports.items():
        if port in seen:
            raise StartupError(f"{seen[port]} and {key} are both {port}; they must differ")
        seen[port] = key
    for key, port in ports.items():
        _check_port(config.tcp.host, port, key)


def _check_port(host: str, port: int, key: str) -> None:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise StartupError(f"host {host!r} cannot be resolved: {e.strerror}") from e
    with socket.socket(family, kind, proto) as probe:
        # As the real listeners do: a port left in TIME_WAIT by our last run is free to use.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise StartupError(f"port {port} on {host} ({key}) is already in use") from e
            raise StartupError(f"cannot bind {host} port {port} ({key}): {e.strerror}") from e


def check_data_path(data_path: Path) -> None:
    """Raise `StartupError` unless the database's directory exists (or can be made) and is
    writable, and `data_path` itself is not a directory."""
    if data_path.is_dir():
        raise StartupError(f"data_path {data_path} is a directory; it must name the database file")
    directory = data_path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StartupError(f"cannot create the data directory {directory}: {_reason(e)}") from e
    # Write a file rather than trust os.access: access() says yes to root on a read-only
    # filesystem, and SQLite needs to create its -wal and -shm files here.
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".shardq-probe-")
    except OSError as e:
        raise StartupError(f"the data directory {directory} is not writable: {_reason(e)}") from e
    os.close(fd)
    os.unlink(probe)


def make_run_dir(data_path: Path, pid: int, shards: int) -> Path:
    """Create the directory of the ipc:// sockets: `<data dir>/run-<pid>`, or a short temporary
    directory when socket paths there would be too long; `run-<pid>` is then a symlink to it,
    so that a restart after `kill -9` finds and sweeps it either way. Mode 0700: anyone who can
    reach a socket can feed the writer mutations. Raises `StartupError` if it cannot be
    created."""
    run_dir = data_path.parent / f"run-{pid}"
    longest = f"{run_dir}/shard-{max(shards - 1, 0)}"
    try:
        if run_dir.exists() or run_dir.is_symlink():  # a previous process with our pid died
            _remove(run_dir)
        if len(longest.encode()) <= MAX_IPC_PATH:
            run_dir.mkdir(mode=0o700)
            return run_dir
        short = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX))
        run_dir.symlink_to(short, target_is_directory=True)
        return short
    except OSError as e:
        raise StartupError(f"cannot create the run directory {run_dir}: {_reason(e)}") from e


def remove_run_dir(data_path: Path, pid: int) -> None:
    """Remove the run directory of process `pid` and its socket files (missing is fine)."""
    _remove(data_path.parent / f"run-{pid}")


def remove_stale_run_dirs(directory: Path) -> list[Path]:
    """Remove `run-<pid>` directories (or links to temporary ones) in `directory` whose
    process is gone; return them.

    A supervisor killed with SIGKILL cannot remove its own.
    """
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            match = _RUN_DIR.fullmatch(entry.name)
            gone = match is not None and not _alive(int(match.group(1)))
            if gone and (entry.is_symlink() or entry.is_dir()):
                _remove(entry)
                removed.append(entry)
    return removed


def _remove(entry: Path) -> None:
    """Remove a run dir; for a link, also the temporary directory it points to, but only one
    that `make_run_dir` could have made (a planted link never deletes anything else)."""
    if not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        target = entry.readlink()
        ours = target.parent == Path(tempfile.gettempdir()) and target.name.startswith(_TEMP_PREFIX)
        if ours and target.is_dir() and target.stat().st_uid == os.getuid():
            shutil.rmtree(target, ignore_errors=True)
    with contextlib.suppress(OSError):
        entry.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    return True


def _reason(e: OSError) -> str:
    return e.strerror or str(e)
