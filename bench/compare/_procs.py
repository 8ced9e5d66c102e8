"""Every process the comparison starts, and how it is stopped: by the PID it started, always.

A `Procs` registry owns the children; `stop_all()` runs in the harness's `finally`. Each child is
started in its own session, so stopping it also reaches the processes it forked itself (a Celery
prefork pool, an RQ work horse): the signal goes to the process group whose id is the PID we
started, never to anything found by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench._server import ShardqProcess, free_port, free_ports
from bench.compare._bunqueue import DROPPED_ENV, BunqueueInstall, ensure_bunqueue, server_env
from bench.compare._env import default_cache
from bench.cpu import cpu_seconds

__all__ = [
    "Child",
    "Procs",
    "cpu_of",
    "free_port",
    "redis_command",
    "start_bunqueue",
    "start_redis",
    "start_shardq",
    "start_standin",
    "wait_port",
]


@dataclass
class Child:
    """One started process: its argv (for the report), its log and its data dir."""

    name: str
    proc: subprocess.Popen[bytes]
    args: list[str]
    log_path: Path
    log: IO[bytes]
    port: int = 0
    workdir: Path | None = None
    group: bool = True

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def members(self) -> list[int]:
        """The live processes of the group the child leads (a forked pool too), or the child
        alone if it leads none. Scans /proc: call it before a time-critical read."""
        if not self.group:
            return [self.pid]
        found = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    if _pgrp(entry.name) == self.pid:
                        found.append(int(entry.name))
        return found

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; to the group the child leads, if it leads one."""
        if self.alive():
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait()
        if self.group:
            # Forked pool processes may outlive their parent by a moment: reap the group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                os.killpg(self.proc.pid, sig)
            else:
                os.kill(self.proc.pid, sig)


def cpu_of(pids: Sequence[int]) -> float:
    """User + system CPU seconds of `pids`, every thread, from /proc; a process gone is 0."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def _pgrp(pid: str) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[2])


@dataclass
class Procs:
    """The registry of children and temporary dirs; `stop_all` is safe to call twice."""

    children: list[Child] = field(default_factory=list)
    shardqs: list[ShardqProcess] = field(default_factory=list)
    dirs: list[Path] = field(default_factory=list)
    commands: dict[str, list[str]] = field(default_factory=dict)  # the first argv of each name
    bunqueue: BunqueueInstall | None = None  # set once Bun and bunqueue are installed

    def tempdir(self, prefix: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        self.dirs.append(path)
        return path

    def spawn(
        self,
        name: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        port: int = 0,
        group: bool = True,
        drop_env: Sequence[str] = (),
    ) -> Child:
        logdir = self.tempdir(f"bench-{name}-")
        log_path = logdir / "output.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed by Child.stop
        proc = subprocess.Popen(
            list(args),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in drop_env},
            cwd=cwd,
            start_new_session=group,
        )
        child = Child(name, proc, list(args), log_path, log, port, logdir, group)
        self.children.append(child)
        shown_env = [f"{k}={v}" for k, v in (env or {}).items() if k != "PYTHONPATH"]
        self.commands.setdefault(name, [*shown_env, *args])
        return child

    def stop(self, child: Child, timeout: float = 15.0) -> None:
        child.stop(timeout)
        if child in self.children:
            self.children.remove(child)

    def stop_shardq(self, server: ShardqProcess) -> None:
        server.stop()
        if server in self.shardqs:
            self.shardqs.remove(server)
        shutil.rmtree(server.dir, ignore_errors=True)

    def stop_all(self) -> None:
        for child in reversed(self.children):
            with contextlib.suppress(Exception):
                child.stop()
        self.children.clear()
        for server in list(self.shardqs):
            with contextlib.suppress(Exception):
                self.stop_shardq(server)
        for path in self.dirs:
            shutil.rmtree(path, ignore_errors=True)
        self.dirs.clear()

    @contextlib.contextmanager
    def running(self, child: Child, timeout: float = 5.0) -> Iterator[Child]:
        """Stop `child` (SIGTERM, SIGKILL after `timeout`) when the block ends."""
        try:
            yield child
        finally:
            self.stop(child, timeout)


def wait_port(port: int, child: Child | None = None, timeout: float = 60.0) -> None:
    """Wait until 127.0.0.1:`port` accepts a connection (and `child` is still alive)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise RuntimeError(f"{child.name} exited early:\n{child.log_tail()}")
        with socket.socket() as s, contextlib.suppress(OSError):
            s.settimeout(0.5)
            s.connect(("127.0.0.1", port))
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


SHUTDOWN_ENV = {"SHUTDOWN_TIMEOUT_MS": "5000"}


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def start_shardq(procs: Procs, *, synchronous: str = "normal") -> ShardqProcess:
    """`shardq start --shards auto` on random ports, in a temporary data dir."""
    # ShardqProcess takes no environment of its own: its child inherits ours for the call.
    saved = {k: os.environ.get(k) for k in ("SHARDQ_SYNCHRONOUS", *SHUTDOWN_ENV)}
    os.environ.update({"SHARDQ_SYNCHRONOUS": synchronous, **SHUTDOWN_ENV})
    try:
        server = ShardqProcess("auto")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    procs.shardqs.append(server)
    name = "shardq" if synchronous == "normal" else f"shardq (synchronous={synchronous})"
    argv = [str(a) for a in server.proc.args] if isinstance(server.proc.args, list) else []
    shown = [f"SHARDQ_SYNCHRONOUS={synchronous}", *(f"{k}={v}" for k, v in SHUTDOWN_ENV.items())]
    procs.commands.setdefault(name, [*shown, *argv])
    return server


def start_bunqueue(procs: Procs) -> Child:
    """bunqueue on Bun, on random ports and a fresh data dir. Bun and bunqueue come from
    `procs.bunqueue`, installed into the default cache dir first if it is not set."""
    install = procs.bunqueue
    if install is None:
        install = procs.bunqueue = ensure_bunqueue(default_cache(), _stderr)
    port, http = free_ports(2)
    data_dir = procs.tempdir("bench-bunqueue-data-")
    env = {**server_env(port, http, data_dir / "bunqueue.db"), **SHUTDOWN_ENV}
    # Its data dir as the working dir: no stray bunqueue.config.* of ours is picked up.
    child = procs.spawn("bunqueue", install.argv, env=env, cwd=data_dir, port=port, group=False,
                        drop_env=DROPPED_ENV)  # fmt: skip
    wait_port(port, child, timeout=120.0)
    return child


def start_standin(procs: Procs) -> Child:
    """`bench.bq_ceiling`'s stand-in server (answers from memory, stores nothing) on a free
    port, with no jobs: `bench compare` fills it by pushing, as it fills a server."""
    port_file = procs.tempdir("bench-standin-") / "port"
    repo = Path(__file__).resolve().parents[2]
    args = [sys.executable, "-m", "bench.bq_ceiling", "--serve", str(port_file), "--jobs", "0"]
    child = procs.spawn("standin", args, env={"PYTHONPATH": str(repo)}, cwd=repo)
    deadline = time.monotonic() + 60.0
    while not (port_file.exists() and port_file.read_text()):
        if not child.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the stand-in did not start:\n{child.log_tail()}")
        time.sleep(0.02)
    child.port = int(port_file.read_text())
    return child


REDIS_ARGS = ("--appendonly", "yes", "--appendfsync", "everysec", "--save", "")


def start_redis(procs: Procs, redis_server: str) -> Child:
    """A private redis-server: AOF on, fsync every second, no RDB snapshots."""
    port = free_port()
    data = procs.tempdir("bench-redis-data-")
    args = [redis_server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
            *REDIS_ARGS, "--daemonize", "no", "--logfile", ""]  # fmt: skip
    child = procs.spawn("redis", args, port=port, group=False)
    wait_port(port, child)
    return child


def redis_command(port: int, *args: str) -> bytes:
    """Send one command in RESP and return the raw first reply line (e.g. FLUSHALL)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"".join(parts))
        return s.recv(65536).split(b"\r\n", 1)[0]
