"""Start and stop a real `shardq start` for benchmarks: random ports, a temporary data dir."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

__all__ = ["ShardqProcess", "free_port", "free_ports", "log_entries", "rss_kb"]


def free_port() -> int:
    """A port of 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct ports of 127.0.0.1 that were free a moment ago: their sockets are held
    open together while they are chosen. (Two `free_port()` calls in a row may return the same
    port: the kernel can hand a just-closed ephemeral port out again.)"""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    """A field of /proc/<pid>/status in kB: resident memory now, or its peak with "VmHWM"."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def log_entries(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON log lines of a server's log file (other lines skipped)."""
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry


class ShardqProcess:
    """`shardq start` in a child process; `stop()` sends SIGTERM to the PID it started."""

    def __init__(
        self,
        shards: str = "auto",
        *extra: str,
        ready_timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shardq-bench-"))
        self.tcp_port, self.zmq_port = free_ports(2)
        self._log: IO[bytes] = open(self.dir / "server.log", "wb")  # noqa: SIM115
        args = [
            sys.executable, "-m", "shardq_cli.main", "start",
            "--host", "127.0.0.1",
            "--tcp-port", str(self.tcp_port),
            "--zmq-port", str(self.zmq_port),
            "--http-port", "0",  # no HTTP process: benchmarks measure the job path alone
            "--data-path", str(self.dir / "shardq.db"),
            "--shards", shards,
            "--log-format", "json",
            *extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args, stderr=self._log, stdout=subprocess.DEVNULL, env=None if env is None else {**env}
        )
        self.ready = self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"shardq exited with {self.proc.returncode}: {self.log_tail()}")
            for entry in log_entries(self.dir / "server.log"):
                if entry.get("event") == "shardq ready":
                    return entry
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"shardq did not become ready in {timeout}s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        text = (self.dir / "server.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
